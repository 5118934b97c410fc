"""Expert parallel as a dimension of the torch mesh (ep_size, strategies/parallel_dims.py) on the CPU
(gloo), fp32, dropless routing, each loss curve against `single` on the same global batches.

Default: the zoo's moe-nano under fsdp-ep at world size 4 (ep 2 borrowed from 4 shard ranks), its mesh
in the header and summary.json, its router counts equal to single's. Extended: a rank killed mid-run
resumed bit for bit; a transformers Mixtral under fsdp-ep; fsdp-ep's checkpoint resumed by fsdp and
by ddp-ep at ep 4 (every expert whole under the model's names in each); at world size 8 ep beside a
pipeline, beside tensor parallel and inside hsdp's shards.

One run per case, shared by every check (module scope).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.testing_hooks import FAULT_ENV
from tests.helpers import TINY_MIXTRAL, env_for_tests, losses_by_step, max_rel_diff, read_run, run_cli, succeeded

pytestmark = pytest.mark.timeout(900)

TOLERANCE = 1e-5  # the compare's fp32 "matches": only the order of floating-point sums differs
RUN = ["device=cpu", "steps=6", "batch_size=8", "seq_len=32", "data_samples=128", "log_every=3"]
MOE_NANO = ["model=moe-nano"]
MIXTRAL = TINY_MIXTRAL
# A pipeline carries no balance loss between its stages: the MoE GPT without one, and its reference.
NO_BALANCE_LOSS = [*MOE_NANO, "model_kwargs.aux_loss_coef=0"]
EP2 = ["strategy_options.ep_size=2"]
CHECKPOINTED = ["checkpoint_every=3"]


def _args(strategy: str, nproc: int, out_dir: Path, extra: list[str]) -> list[str]:
    return ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *RUN, *extra]


def _run(tmp_path_factory, name: str, strategy: str, nproc: int, extra: list[str]) -> tuple[dict, list, str, Path]:
    out_dir = tmp_path_factory.mktemp(name)
    stdout = succeeded(run_cli(_args(strategy, nproc, out_dir, extra), env=env_for_tests(), timeout=400))
    return (*read_run(out_dir), stdout, out_dir)


@pytest.fixture(scope="module")
def nano(tmp_path_factory) -> dict[str, tuple[dict, list, str, Path]]:
    """single and fsdp-ep (ep 2 x shard 2, checkpointing at step 3) on moe-nano."""
    return {
        "single": _run(tmp_path_factory, "single", "single", 1, MOE_NANO),
        "fsdp-ep": _run(tmp_path_factory, "fsdp-ep", "fsdp-ep", 4, [*MOE_NANO, *EP2, *CHECKPOINTED]),
    }


def test_fsdp_ep_matches_single_at_every_step(nano, record_property):
    summary, rows, _, _ = nano["fsdp-ep"]
    deviation = max_rel_diff(rows, nano["single"][1])
    record_property("max_rel_loss_diff", deviation)
    assert deviation < TOLERANCE
    assert summary["data_parallel_size"] == 4


def test_ep_is_laid_out_inside_the_data_parallel_ranks(nano):
    summary, _, stdout, _ = nano["fsdp-ep"]
    assert summary["mesh"]["dims"] == ["shard", "ep"] and summary["mesh"]["shape"] == [2, 2]
    assert summary["mesh"]["data_dims"] == ["shard", "ep"]
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: shard x ep" in header
    assert "expert parallel over 2 (all-to-all dispatch; 2 experts modules" in header
    # Each rank holds a quarter of the dense weights and of its two experts: under a quarter of single's.
    assert summary["mem_params_bytes"] < nano["single"][0]["mem_params_bytes"] / 3


def test_the_router_figures_are_singles(nano):
    single, ep = nano["single"][0]["router"], nano["fsdp-ep"][0]["router"]
    assert ep["router_tokens_per_expert"] == single["router_tokens_per_expert"]
    assert ep["all_to_all_ms_per_step"] > 0 and single["all_to_all_ms_per_step"] is None


@pytest.mark.extended  # ddp-ep's in test_equivalence_moe.py runs the mesh's checkpoints with ep by default
def test_a_killed_rank_resumes_bit_for_bit(nano, tmp_path):
    reference = losses_by_step(nano["fsdp-ep"][3])
    extra = [*MOE_NANO, *EP2, *CHECKPOINTED]
    killed = run_cli(_args("fsdp-ep", 4, tmp_path, extra), env=env_for_tests(**{FAULT_ENV: "kill@1:4"}), timeout=400)
    assert killed.returncode != 0
    resumed = succeeded(run_cli(_args("fsdp-ep", 4, tmp_path, [*extra, "resume=auto"]), timeout=400))
    assert "resumed at step 3" in resumed
    assert losses_by_step(tmp_path) == reference


@pytest.mark.extended
def test_a_transformers_mixtral_under_fsdp_ep_matches_single(tmp_path_factory):
    single = _run(tmp_path_factory, "mixtral-single", "single", 1, MIXTRAL)
    summary, rows, _, _ = _run(tmp_path_factory, "mixtral-fsdp-ep", "fsdp-ep", 4, [*MIXTRAL, *EP2])
    assert max_rel_diff(rows, single[1]) < TOLERANCE
    assert summary["router"]["router_tokens_per_expert"] == single[0]["router"]["router_tokens_per_expert"]


@pytest.mark.extended
@pytest.mark.parametrize("strategy, extra", [("fsdp", []), ("ddp-ep", ["strategy_options.ep_size=4"])])
def test_another_layout_resumes_fsdp_eps_checkpoint(nano, tmp_path, strategy, extra):
    """The experts whole under the model's names in every layout's DCP checkpoint: another layout
    loads model and optimizer state, and continues the uninterrupted curve."""
    checkpoint = nano["fsdp-ep"][3] / "checkpoints" / "step_3"
    args = _args(strategy, 4, tmp_path, [*MOE_NANO, *extra, f"resume={checkpoint}"])
    resumed = succeeded(run_cli(args, env=env_for_tests(), timeout=400))
    assert "resumed at step 3" in resumed
    reference, continued = losses_by_step(nano["fsdp-ep"][3]), losses_by_step(tmp_path)
    for step in (4, 5, 6):
        assert continued[step] == pytest.approx(reference[step], rel=TOLERANCE), step


@pytest.mark.extended
@pytest.mark.parametrize(
    "name, strategy, model, extra, mesh",
    [
        # pp 2 x shard 4, ep 2 inside each stage's shard ranks.
        ("pp", "fsdp-pp", NO_BALANCE_LOSS, ["strategy_options.pp_size=2", *EP2], ["pp", "shard", "ep"]),
        # tp 2 beside ep 2: the attention split, each MoE layer whole on both ranks of a tp pair.
        ("tp", "fsdp-tp", MOE_NANO, ["strategy_options.tp_size=2", *EP2], ["shard", "ep", "tp"]),
        # hsdp: ep inside the shard ranks, the experts replicated over the replicas as the rest.
        ("hsdp", "hsdp", MOE_NANO, ["strategy_options.shard_size=4", *EP2], ["replicate", "shard", "ep"]),
    ],
)
def test_world_size_8_combinations_match_single(tmp_path_factory, name, strategy, model, extra, mesh):
    single = _run(tmp_path_factory, f"{name}-single", "single", 1, model)
    summary, rows, _, _ = _run(tmp_path_factory, name, strategy, 8, [*model, *extra])
    assert summary["mesh"]["dims"] == mesh
    assert max_rel_diff(rows, single[1]) < TOLERANCE
    assert summary["router"]["router_tokens_per_expert"] == single[0]["router"]["router_tokens_per_expert"]
