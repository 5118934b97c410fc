"""bench/layer_syncs.py: the copies it adds run where Megatron-DeepSpeed's do (each block's forward
and its recomputation), and its dry run writes the table measured beside planned."""

from __future__ import annotations

import torch

from bench.layer_syncs import DRY_MODEL, MICRO_BATCHES, main, with_layer_copies
from harness.plan.speed.host_issue import LAYER_SYNC_COPIES
from models.gpt import GPT


def test_each_blocks_forward_and_its_recomputation_make_the_copies():
    model = GPT(DRY_MODEL)
    model.activation_checkpointing = True
    made = with_layer_copies(model)
    tokens = torch.randint(0, DRY_MODEL.vocab_size, (1, DRY_MODEL.block_size))
    loss = model(tokens, tokens)
    assert len(made) == LAYER_SYNC_COPIES * DRY_MODEL.n_layer
    loss.backward()
    assert len(made) == 2 * LAYER_SYNC_COPIES * DRY_MODEL.n_layer


def test_the_dry_run_writes_both_columns_and_the_plan_prices_the_copies(tmp_path):
    out = tmp_path / "layer_syncs.md"
    assert main(["--dry-run", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == list(MICRO_BATCHES)
    planned_ratio = [float(row.split("|")[7]) for row in rows]
    assert planned_ratio[0] > 1.0 and all(r >= 1.0 for r in planned_ratio)
