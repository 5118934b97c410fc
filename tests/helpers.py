"""Running parabench as a user would, in subprocesses bounded by a timeout."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Generic, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RUNNER = str(ROOT / "runner.py")
FORKED_TORCHRUN = str(ROOT / "tests" / "forked_torchrun.py")
# Small and quick, yet long enough for the curves to mean something.
NANO = ["device=cpu", "model=gpt-nano", "steps=10", "batch_size=8", "seq_len=32", "data_samples=256", "log_every=5"]
# A transformers Mixtral small enough for the CPU: 4 experts, top-2, its balance loss on.
TINY_MIXTRAL = [
    "model=hf:MixtralConfig",
    "model_kwargs.hidden_size=64",
    "model_kwargs.intermediate_size=128",
    "model_kwargs.num_hidden_layers=2",
    "model_kwargs.num_attention_heads=4",
    "model_kwargs.num_key_value_heads=2",
    "model_kwargs.num_local_experts=4",
    "model_kwargs.num_experts_per_tok=2",
    "model_kwargs.vocab_size=128",
    "model_kwargs.output_router_logits=true",
    "model_kwargs.router_aux_loss_coef=0.02",
]
# After NANO: a small Hugging Face Llama (RoPE, grouped-query attention, an untied head) of four
# layers, for four steps: the pipeline tests' model that is not the zoo's.
LLAMA_4 = [
    "model=hf:LlamaConfig",
    "model_kwargs.num_hidden_layers=4",
    "model_kwargs.hidden_size=64",
    "model_kwargs.num_attention_heads=4",
    "model_kwargs.num_key_value_heads=2",
    "model_kwargs.intermediate_size=128",
    "model_kwargs.vocab_size=128",
    "steps=4",
    "log_every=2",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class OnFirstUse(Mapping[K, V], Generic[K, V]):
    """A module's runs by name, each made by `make(name)` when a test first reads it, then kept:
    shared by the module's tests as a dict of runs would be, while a session pays only for the
    runs its selected tests read (an `extended` case's run only under `--all`)."""

    def __init__(self, names: Iterable[K], make: Callable[[K], V]) -> None:
        self._names = list(names)
        self._make = make
        self._made: dict[K, V] = {}

    def __getitem__(self, name: K) -> V:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names  # without making it

    def __iter__(self) -> Iterator[K]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def made_once(basetemp: Path, name: str, make: Callable[[Path], object]) -> Path:
    """The folder `name`, filled by `make(folder)` once per test session (`basetemp`: the session's
    tmp_path_factory.getbasetemp()). Under pytest-xdist every worker asks for the same folder, in
    the session's temporary directory above the workers' own: the first to ask makes it while the
    others wait, and a make that failed is made again by the next to ask. For runs that more than
    one test file reads, which a session fixture or a cache would train once in each worker."""
    root = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder, done = root / "made-once" / name, root / "made-once" / f"{name}.done"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (root / "made-once" / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed make left
            make(folder)
            done.touch()
    return folder


def env_for_tests(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **extra)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def run_bounded(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`cmd` with its output captured, killed at `timeout` together with every process it started:
    a launcher's ranks left running would take the cores of the tests that follow."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or env_for_tests(),
        cwd=cwd or ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def forked_torchrun(
    nproc: int | tuple[int, ...], worker: Path | str, *args: str, backends: bool | Iterable[str] = False
) -> list[str]:
    """The command that runs one of the tests' worker scripts on `nproc` ranks, as torchrun's
    standalone launch would, each rank forked after the imports they share (tests/forked_torchrun.py);
    several counts: one launch after another, the imports paid once. `backends`: every strategy's
    libraries among them (True), or those of the strategies named, for a worker that sets them up."""
    counts = ",".join(map(str, nproc)) if isinstance(nproc, tuple) else str(nproc)
    flag = [] if backends is False else ["--backends"] if backends is True else [f"--backends={','.join(backends)}"]
    return [sys.executable, FORKED_TORCHRUN, *flag, counts, str(worker), *args]


def run_cli(
    args: list[str],
    *,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    prefix: list[str] | None = None,
) -> subprocess.CompletedProcess:
    """`python runner.py <args>` (or `<prefix> runner.py <args>` for another launcher), killed at `timeout`."""
    return run_bounded((prefix or [sys.executable]) + [RUNNER, *args], timeout=timeout, env=env, cwd=cwd)


def read_run(out_dir: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def train(
    out_dir: Path, strategy: str, nproc: int = 1, extra: list[str] | None = None, timeout: float = 240
) -> tuple[dict, list[dict]]:
    """Train and return (summary, metrics rows); fails the test with the log on a non-zero exit."""
    proc = run_cli(
        ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *(extra or [])],
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"train {strategy} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return read_run(out_dir)


def trained_once(basetemp: Path, strategy: str, nproc: int = 1) -> Path:
    """The folder of `train(...)` on NANO, made once a session for every xdist worker (made_once),
    its stdout kept beside the run as stdout.txt: for a run that more than one test file reads."""

    def make(out: Path) -> None:
        proc = run_cli(["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out}", *NANO], timeout=240)
        assert proc.returncode == 0, (
            f"train {strategy} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        (out / "stdout.txt").write_text(proc.stdout)

    return made_once(basetemp, f"{strategy}-nproc{nproc}", make)


def succeeded(proc: subprocess.CompletedProcess) -> str:
    """The stdout of a run that exited 0; fails the test with the ends of its output otherwise."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def losses_by_step(out_dir: Path) -> dict[int, float]:
    """step -> loss of the run in `out_dir`, from its metrics.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines())}


def max_rel_diff(rows: list[dict], reference: list[dict]) -> float:
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    return max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows, reference, strict=True))
