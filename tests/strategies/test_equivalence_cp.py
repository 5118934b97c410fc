"""fsdp-cp on a 2 x 2 mesh (CPU, gloo, world size 4: each sequence split over two ranks, two such
groups reading different data), gpt-nano in fp32: the loss curve against `single` on the same global
batches (the all-to-all attention exact, the positions offset per slice, the loss the mean over every
token), the mesh in the header and summary.json, what each rank holds, and the refusals in one line.

One run, shared by every check (module scope), with two micro-steps of accumulation per step.
"""

from __future__ import annotations

import pytest

from models.zoo import build_model
from strategies.base import StrategyError
from tests.helpers import NANO, env_for_tests, max_rel_diff, read_run, run_cli
from tests.strategies.constructed import constructed

pytestmark = pytest.mark.timeout(900)

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(summary, rows, stdout)."""
    out_dir = tmp_path_factory.mktemp("fsdp-cp")
    args = ["train", "strategy=fsdp-cp", f"nproc={NPROC}", f"out_dir={out_dir}", *NANO, "micro_batch=2"]
    proc = run_cli([*args, "strategy_options.cp_size=2"], env=env_for_tests(), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return (*read_run(out_dir), proc.stdout)


def test_loss_matches_single_at_every_step(run, reference_run, record_property):
    summary, rows, _ = run
    deviation = max_rel_diff(rows, reference_run[1])
    record_property("max_rel_loss_diff", deviation)
    print(f"fsdp-cp: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


def test_the_header_and_summary_give_the_mesh(run):
    summary, _, stdout = run
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["shard", "cp"]
    # The ranks of a context-parallel group read the same sequences: 8 over 2 groups, 2 micro-steps of 2.
    assert summary["data_parallel_size"] == 2 and (summary["micro_batch"], summary["grad_accum"]) == (2, 2)
    assert "context parallel over 2 (all-to-all attention)" in summary["blocks"]["units"]
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: shard x cp" in header and "global batch 8 = 2 data-parallel ranks x" in header


def test_each_rank_holds_a_quarter_of_the_model(run, reference_run):
    """FSDP shards over all four ranks: context parallel splits the activations, not the parameters."""
    single, split = reference_run[0], run[0]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert split[key] == pytest.approx(single[key] / 4, rel=0.05), key


def _strategy(cp_size: int, seq_len: int):
    config = type("Config", (), {"seq_len": seq_len})()
    return constructed("fsdp-cp", 4, micro_batch=2, config=config, cp_size=cp_size)


@pytest.mark.parametrize(
    "cp_size, seq_len, says",
    [
        (4, 32, "cp_size=4 does not divide the model's 2 attention heads"),
        (2, 33, "seq_len=33 does not split over cp_size=2"),
    ],
)
def test_a_split_that_cannot_run_says_why_in_one_line(cp_size, seq_len, says):
    with pytest.raises(StrategyError) as err:
        _strategy(cp_size, seq_len).check_model(build_model("gpt-nano"))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_model_it_cannot_split_says_so():
    with pytest.raises(StrategyError, match="context parallel splits parabench's GPT"):
        _strategy(2, 32).check_model(build_model("mlp"))
