"""nanotron's cut of a model into pipeline stages, which balances its own estimate of each block's
compute rather than counting blocks (huggingface/nanotron at the branch the Ultra-Scale Playbook's
benchmarks ran, nouamane/bench2 @ 67c5ebb6a925: `models/base.py` build_model and `models/llama.py`
get_block_compute_costs).

Each pipeline block weighs what get_block_compute_costs gives it: a decoder layer
4 x heads x head_dim x width (its q, k, v and output projections, counted as if every head had its
own k and v) + 3 x ffn x width (gate, up and down), the head vocab x width, the embedding, the final
norm, the fp32 cast and the loss nothing. Rank r's share ends where the running sum of weights first
passes (r + 1) / pp of the total: blocks are given to a rank in order, and the block whose sum passes
its share is the rank's last. A head as heavy as several layers so gets a rank of its own, or nearly:
a 16-layer model whose head weighs four layers, over 8 ranks, is 3, 3, 2, 3, 2, 3 layers, then the
head alone, then the loss alone.

The plan counts the head and the loss on one GPU (StageSplit's last); where nanotron puts the loss on
the rank after the head's, the logits that cross between them are not priced.
"""

from __future__ import annotations

from harness.plan.model.model_shape import TransformerDims
from harness.plan.parallel.layout import LayoutError
from harness.plan.parallel.pipeline_cost import StageSplit


def nanotron_stage_blocks(dims: TransformerDims, stages: int) -> tuple[list[int], int]:
    """The decoder layers on each of `stages` ranks, and the rank that holds the head."""
    if stages > dims.layers:
        raise LayoutError(f"pp_size={stages} is more stages than the {dims.layers} blocks")
    layer = 4 * dims.heads * dims.head_dim * dims.width + 3 * dims.ffn_width * dims.width
    head = dims.vocab * dims.width
    total = dims.layers * layer + head
    # Exact integers, as nanotron's numpy cumsum of integer costs: a sum equal to a share stays.
    shares = [total * (rank + 1) for rank in range(stages)]
    blocks, rank, running = [0] * stages, 0, 0
    for _ in range(dims.layers):
        running += layer
        blocks[rank] += 1
        if running * stages > shares[rank]:
            rank += 1
    return blocks, rank


def nanotron_split(dims: TransformerDims, stages: int) -> StageSplit:
    """nanotron's cut as the plan's StageSplit: the head's rank is the last (beside the head and the
    loss), the ranks after it, which hold the loss alone, left out."""
    blocks, head_rank = nanotron_stage_blocks(dims, stages)
    return StageSplit.of(blocks[: head_rank + 1])
