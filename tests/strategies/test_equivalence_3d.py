"""Layouts of three and four dimensions on eight CPU ranks (gloo), 2 x 2 x 2 each, in fp32: each loss
curve against `single` on the same global batches, the mesh in the header and summary.json, and a
rank killed under DDP x TP x PP resuming to the uninterrupted curve bit for bit.

- DDP x TP x PP (Megatron-LM's layout: `ddp-tp` + pp_size), ZeRO-1 x TP x PP (`zero1-tp` + pp_size),
  FSDP x TP x PP and FSDP x TP x CP (`fsdp-tp` + pp_size or cp_size) on parabench's GPT and on a
  Hugging Face Llama built from its config class (4 layers, 4 heads, 2 key/value heads: its own
  tensor-parallel plan, the pipeline's generic cut, parabench's all-to-all attention in
  transformers' registry);
- torchtitan's 4D (`fsdp-tp` + pp_size + cp_size: one data-parallel rank) on the GPT, and HSDP x TP
  (`hsdp` + tp_size) on the Llama.

One run per layout and one `single` per model, shared by every check (module scope); four steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.testing_hooks import FAULT_ENV
from tests.helpers import env_for_tests, losses_by_step, max_rel_diff, read_run, run_cli, succeeded

pytestmark = [pytest.mark.extended, pytest.mark.timeout(1800)]

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 8
COMMON = ["device=cpu", "steps=4", "batch_size=8", "seq_len=32", "data_samples=256", "log_every=1"]
# Four blocks for two stages, four heads for tp 2 x cp 2.
GPT = ["model=gpt-nano", "model_kwargs.n_layer=4", "model_kwargs.n_head=4"]
LLAMA = [
    "model=hf:LlamaConfig",
    "model_kwargs.hidden_size=64",
    "model_kwargs.num_hidden_layers=4",
    "model_kwargs.num_attention_heads=4",
    "model_kwargs.num_key_value_heads=2",
    "model_kwargs.intermediate_size=128",
    "model_kwargs.vocab_size=128",
    "model_kwargs.max_position_embeddings=64",
]
TP, PP, CP = "strategy_options.tp_size=2", "strategy_options.pp_size=2", "strategy_options.cp_size=2"
# name -> (model, strategy, options, mesh dims, mesh shape)
RUNS = {
    "ddp-tp-pp": (GPT, "ddp-tp", [TP, PP, "checkpoint_every=2"], ["pp", "replicate", "tp"], [2, 2, 2]),
    "zero1-tp-pp": (GPT, "zero1-tp", [TP, PP], ["pp", "replicate", "tp"], [2, 2, 2]),
    "fsdp-tp-pp": (GPT, "fsdp-tp", [TP, PP], ["pp", "shard", "tp"], [2, 2, 2]),
    "fsdp-tp-cp": (GPT, "fsdp-tp", [TP, CP], ["shard", "cp", "tp"], [2, 2, 2]),
    "fsdp-tp-pp-cp": (GPT, "fsdp-tp", [TP, PP, CP], ["pp", "shard", "cp", "tp"], [2, 1, 2, 2]),
    "llama-ddp-tp-pp": (LLAMA, "ddp-tp", [TP, PP], ["pp", "replicate", "tp"], [2, 2, 2]),
    "llama-zero1-tp-pp": (LLAMA, "zero1-tp", [TP, PP], ["pp", "replicate", "tp"], [2, 2, 2]),
    "llama-fsdp-tp-pp": (LLAMA, "fsdp-tp", [TP, PP], ["pp", "shard", "tp"], [2, 2, 2]),
    "llama-fsdp-tp-cp": (LLAMA, "fsdp-tp", [TP, CP], ["shard", "cp", "tp"], [2, 2, 2]),
    "llama-hsdp-tp": (LLAMA, "hsdp", [TP, "strategy_options.shard_size=2"], ["replicate", "shard", "tp"], [2, 2, 2]),
}


def _launch(model: list[str], strategy: str, out_dir: Path, extra: list[str], nproc: int, fault: str | None = None):
    env = env_for_tests(**({FAULT_ENV: fault} if fault else {}))
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *COMMON, *model, *extra]
    return run_cli(args, env=env, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (summary, rows, stdout, out_dir); "gpt" and "llama" are the two `single` references."""
    out = {}
    for name, model in (("gpt", GPT), ("llama", LLAMA)):
        out_dir = tmp_path_factory.mktemp(name)
        stdout = succeeded(_launch(model, "single", out_dir, [], nproc=1))
        out[name] = (*read_run(out_dir), stdout, out_dir)
    for name, (model, strategy, extra, _, _) in RUNS.items():
        out_dir = tmp_path_factory.mktemp(name)
        stdout = succeeded(_launch(model, strategy, out_dir, extra, NPROC))
        out[name] = (*read_run(out_dir), stdout, out_dir)
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_each_layout_matches_single_at_every_step(runs, name, record_property):
    summary, rows, _, _ = runs[name]
    reference = runs["llama" if name.startswith("llama") else "gpt"][1]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


@pytest.mark.parametrize("name", list(RUNS))
def test_the_header_and_summary_give_the_mesh(runs, name):
    summary, _, stdout, _ = runs[name]
    dims, shape = RUNS[name][3], RUNS[name][4]
    assert (summary["mesh"]["dims"], summary["mesh"]["shape"]) == (dims, shape)
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert f"mesh {' x '.join(map(str, shape))}: {' x '.join(dims)}" in header


def test_a_killed_rank_under_ddp_tp_pp_resumes_to_the_uninterrupted_curve_bit_for_bit(runs, tmp_path):
    """Rank 7 (the last stage: the loss and the head's copy of the tied embedding) SIGKILLs itself
    once step 3 is done, a step past the step-2 checkpoint; `resume=auto` redoes steps 3 and 4."""
    model, strategy, extra, _, _ = RUNS["ddp-tp-pp"]
    out = tmp_path / "killed"
    killed = _launch(model, strategy, out, extra, NPROC, fault="kill@7:3")
    assert killed.returncode != 0
    assert "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]
    resumed = succeeded(_launch(model, strategy, out, [*extra, "resume=auto"], NPROC))
    assert "resumed at step 2" in resumed and "model and optimizer state" in resumed
    assert losses_by_step(out) == losses_by_step(runs["ddp-tp-pp"][3])
