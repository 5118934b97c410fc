"""The planner refuses exactly the context-parallel sizes the runtime refuses, in the runtime's
words: all-to-all needs seq_len % cp and whole query and key/value heads on each rank (or one
key/value head repeated), the ring 2 x cp head-and-tail chunks and any heads."""

from __future__ import annotations

import itertools

import pytest

from harness.plan.model.model_shape import TransformerDims
from harness.plan.parallel.context_parallel_cost import context_parallel_of
from harness.plan.parallel.layout import LayoutError
from models.sequence_split import sequence_split_error
from strategies.mesh_layout import MeshError
from strategies.parallel_dims import ModelFacts, ParallelDims, check_model_fits


def _dims(heads: int, kv_heads: int) -> TransformerDims:
    return TransformerDims(
        layers=4, width=64 * heads, heads=heads, head_dim=64, kv_heads=kv_heads, ffn_width=256, vocab=512
    )


def _planned(heads: int, kv_heads: int, tp: int, cp: int, seq_len: int, attention: str) -> str | None:
    try:
        context_parallel_of({"cp_attention": attention}, _dims(heads, kv_heads), seq_len, tp, cp)
    except LayoutError as exc:
        return str(exc)
    return None


def _runtime(heads: int, kv_heads: int, tp: int, cp: int, seq_len: int, attention: str) -> str | None:
    """The runtime's refusal: the mesh's heads check (strategies/torch_mesh.py's check_model, via
    check_model_fits), then the sequence's (models/context_parallel.py's check_context_parallel)."""
    try:
        check_model_fits(ParallelDims(tp * cp, cp=cp, tp=tp), ModelFacts(4, heads, kv_heads), 1, attention)
    except MeshError as exc:
        return str(exc)
    return sequence_split_error(seq_len, cp, attention)


def test_all_to_all_needs_seq_divisible_by_cp_not_twice_cp() -> None:
    assert _planned(16, 16, 1, 4, 4100, "all-to-all") is None  # 4100 = 4 x 1025, not a multiple of 8
    assert _planned(16, 16, 1, 4, 4100, "ring") == (
        "seq_len=4100 does not split into 2 x 4 head-and-tail chunks: use a seq_len that 8 divides"
    )
    assert _planned(16, 16, 1, 4, 4098, "all-to-all") == (
        "seq_len=4098 does not split into cp_size=4 slices: use a seq_len that 4 divides"
    )


def test_all_to_all_refuses_key_value_heads_cp_does_not_share_out() -> None:
    why = _planned(12, 6, 1, 4, 4096, "all-to-all")
    assert why is not None and "6 key/value heads" in why and "cp_size=1 or 2 or 3 or 6" in why
    assert _planned(12, 6, 1, 4, 4096, "ring") is None  # the ring splits the sequence, not the heads
    assert _planned(32, 4, 2, 4, 4096, "all-to-all") is None  # 2 key/value heads a tp rank, each repeated


@pytest.mark.parametrize("attention", ["all-to-all", "ring"])
def test_planner_and_runtime_refuse_the_same(attention: str) -> None:
    for heads, kv_heads, tp, cp, seq_len in itertools.product(
        (12, 16, 32), (2, 6, 8), (1, 2), (2, 3, 4, 8), (4096, 4100, 4098, 6144)
    ):
        if heads % kv_heads or heads % tp or kv_heads % tp:
            continue
        assert _planned(heads, kv_heads, tp, cp, seq_len, attention) == _runtime(
            heads, kv_heads, tp, cp, seq_len, attention
        ), (heads, kv_heads, tp, cp, seq_len)
