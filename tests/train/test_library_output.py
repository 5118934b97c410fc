"""What the libraries print goes to <out_dir>/log.txt, not the terminal, in a lone `train` run:
a ZeRO-3 run on the CPU shows parabench's lines only, while its log holds DeepSpeed's notices
and torch's deprecation warnings, each once with its count. verbose=true prints them, and a
crash's traceback still reaches the terminal."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.helpers import NANO, ROOT, env_for_tests, run_cli

# Parabench's own lines in a run's terminal: the header, the steps, where the log is.
OWN_LINES = ("parabench train | ", "step ", "library output: ")

NOISY_MODEL = """
import warnings
import torch

class Noisy(torch.nn.Module):
    '''A model that warns on every forward, as a library might, and fails where told to.'''

    def __init__(self, fail: bool = False):
        super().__init__()
        self.vocab_size, self.fail = 128, fail
        self.embed, self.head = torch.nn.Embedding(128, 16), torch.nn.Linear(16, 128)

    def forward(self, inputs, targets):
        with warnings.catch_warnings():  # as libraries do: it resets Python's once-per-place memory
            pass
        warnings.warn("noisy library: this call is deprecated", FutureWarning)
        if self.fail:
            raise RuntimeError("deliberate failure in forward")
        logits = self.head(self.embed(inputs))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

def build(fail: bool = False):
    return Noisy(fail)
"""


def test_a_zero3_run_keeps_library_warnings_out_of_the_terminal(tmp_path):
    out = tmp_path / "zero3"
    proc = run_cli(["train", "strategy=zero3", "nproc=2", *NANO, f"out_dir={out}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert all(line.startswith(OWN_LINES) for line in lines), proc.stdout
    assert lines[-1] == f"library output: {out / 'log.txt'} (verbose=true prints it here)"
    log = (out / "log.txt").read_text()
    # What went there instead: torch's FutureWarnings, each distinct one written once per rank with how
    # often it came. No build notice of DeepSpeed's CPU op: a run leaves the op unbuilt.
    assert "built successfully" not in log
    warned = [line for line in log.splitlines() if "FutureWarning: `torch.distributed.reduce_scatter_tensor`" in line]
    assert len(warned) == 4 and sum(line.startswith("(came ") for line in warned) == 2, log


@pytest.fixture
def noisy_env(tmp_path):
    (tmp_path / "noisy_model.py").write_text(textwrap.dedent(NOISY_MODEL))
    env = env_for_tests()
    env["PYTHONPATH"] = f"{ROOT}:{tmp_path}"
    return env


def test_verbose_prints_them_and_a_crash_is_still_seen(tmp_path, noisy_env):
    args = ["train", "strategy=single", *NANO, "model=noisy_model:build"]
    quiet = run_cli([*args, f"out_dir={tmp_path / 'quiet'}"], env=noisy_env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert "deprecated" not in quiet.stdout
    log = (tmp_path / "quiet" / "log.txt").read_text()
    assert len(re.findall(r"noisy_model\.py:\d+: FutureWarning: noisy library: this call is deprecated", log)) == 1
    assert "(came 10 times: FutureWarning: noisy library: this call is deprecated)" in log

    verbose = run_cli([*args, "verbose=true", f"out_dir={tmp_path / 'verbose'}"], env=noisy_env)
    assert verbose.returncode == 0 and "FutureWarning: noisy library" in verbose.stderr
    assert not (tmp_path / "verbose" / "log.txt").exists()

    crash = run_cli([*args, "model_kwargs.fail=true", f"out_dir={tmp_path / 'crash'}"], env=noisy_env)
    assert crash.returncode == 1
    # The traceback on the terminal, a copy in the log.
    assert "RuntimeError: deliberate failure in forward" in crash.stderr
    assert (
        "Traceback" in crash.stderr
        and "RuntimeError: deliberate failure" in (tmp_path / "crash" / "log.txt").read_text()
    )
