"""compile=true: each backend compiles what it can take (the whole model, loss included,
where nothing hooks the blocks; per block under FSDP and ZeRO-3), says so in its summary,
and trains the same curve as eager `single`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from configs.schema import RunConfig
from harness.train.distributed import DistEnv
from harness.train.loop import _header, built
from tests.helpers import NANO, env_for_tests, max_rel_diff, read_run, run_cli

# Inductor on the CPU fuses and reorders fp32 arithmetic: close to eager, not bit-equal.
TOLERANCE = 1e-4
# What dynamo's DDPOptimizer logs (TORCH_LOGS=ddp) when it splits a graph at DDP's buckets.
DDP_SPLIT = "DDPOptimizer used bucket cap"


# Every change: the whole model compiled under DDP's split and per block under FSDP; the other
# backends' ways of the same two are `extended`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, nproc, compiled",
    [
        pytest.param("single", 1, "whole model", marks=pytest.mark.extended),
        pytest.param(
            "ddp", 1, "whole model, one graph (one rank: no all-reduce to overlap)", marks=pytest.mark.extended
        ),
        ("ddp", 2, "whole model, split at DDP's 25 MB buckets"),
        pytest.param("accelerate-zero2", 2, "whole model", marks=pytest.mark.extended),
        ("fsdp", 2, "per block (2 Block)"),
        pytest.param("zero3", 2, "per block (2 Block)", marks=pytest.mark.extended),
    ],
)
def test_compiled_run_matches_eager_single(tmp_path, strategy, nproc, compiled, reference_run):
    proc = run_cli(
        ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={tmp_path}", *NANO, "compile=true"],
        timeout=300,
        env=env_for_tests(TORCH_LOGS="ddp"),
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary, rows = read_run(tmp_path)
    assert summary["compiled"] == compiled
    # DDPOptimizer splits the graph under DDP above one rank only (accelerate-zero2 is not DDP). What
    # the libraries log goes to the run's log.txt, not the terminal.
    library_log = (tmp_path / "log.txt").read_text()
    assert (DDP_SPLIT in library_log) == (strategy == "ddp" and nproc > 1), library_log[-3000:]
    deviation = max_rel_diff(rows, reference_run[1])
    print(f"{strategy} compiled ({compiled}): largest relative loss deviation from eager single = {deviation:.2e}")
    assert deviation < TOLERANCE


def test_eager_run_says_it_was_not_compiled(reference_run):
    """compile=false leaves the model's forward its own and says so (summary null, no word in the
    run's header); compile=true, the same run otherwise, replaces the forward and says that."""
    assert reference_run[0]["compiled"] is None
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    for compile, said in ((False, None), (True, "whole model")):
        cfg = RunConfig(strategy="single", model="gpt-nano", device="cpu", seq_len=32, data_samples=64, compile=compile)
        with built(cfg, env) as training:
            training.setup()
            # Module.compile() installs the compiled forward here; nothing runs until the first step.
            replaced = training.model._compiled_call_impl is not None
            assert (training.compiled, replaced) == (said, compile)
            no_router = SimpleNamespace(router=None)  # the header reads only the metrics' router
            assert ("compiled:" in _header(training, no_router)) == compile
