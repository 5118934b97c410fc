"""What a mixture of experts communicates beyond its dense part (moe_shape.py), per step on one GPU.

Dispatch and combine: every MoE block sends each token to the GPUs of its top_k experts and brings their
outputs back, an all-to-all over the ep GPUs each way (all_to_all.py prices it); the backward sends the
gradients the same two ways. Each GPU exchanges its tokens x top_k x H elements each time, in the
activations' dtype (the busiest GPU's receipt is `moe_imbalance` times the mean, and every GPU waits on
it; a capacity that drops caps it, one padded sends every expert its capacity: Megatron-core's alltoall
dispatcher under --moe-pad-expert-input-to-capacity exchanges capacity x experts tokens a rank,
megatron/core/transformer/moe/token_dispatcher.py @ 6a6cd478, `preprocess`). They sit in the block's
critical path, as tensor parallelism's collectives do: the expert computes on what the dispatch brought,
the next block on what the combine returned. Full checkpointing, and Megatron-core's `moe` recompute
module, run the forward's two again. With one GPU per expert group (ep 1) nothing is exchanged: each GPU
routes its own tokens to its own copy of every expert.

The experts' gradients are reduced over the edp GPUs holding the same experts by the strategy's own
engine, as comm.py reduces the rest over the data-parallel GPUs (DeepSpeed's ZeRO-1/2 all-reducing
its buckets, Megatron's distributed optimizer reduce-scattering them and gathering the updated
parameters, FSDP2 gathering and reduce-scattering each block's, torch's replicate (ddp-ep)
all-reducing each block's during the backward).

With tensor parallel and experts not split by it (etp 1, Megatron-core's parallel folding), an MoE
block's tokens reach its experts by the all-to-all alone: the MLP's tensor-parallel gather and
scatter that a dense block runs are not run (comm.py's `tensor_parallel_sublayers`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from harness.plan.memory.expert_memory import expert_shape, expert_states_layout
from harness.plan.memory.model_states import BYTES
from harness.plan.memory.recipe import Recipe
from harness.plan.model.model_shape import ModelShape
from harness.plan.network.comm import Collective, collectives
from harness.plan.network.fabric import Group
from harness.plan.parallel.backends import Backend
from harness.plan.parallel.expert_layout import ExpertLayout

DISPATCH_WHAT = "all-to-all tokens to their experts and back (expert parallel)"
A2A_OVERLAP = "a2a_overlap"  # a published layout's option: the all-to-alls beside another micro-batch's compute
# A published layout's dispatcher: "all-to-all" (NCCL's, as parabench's ddp-ep runs it, and
# Megatron-core's alltoall dispatcher), or NODE_FORWARDING (DeepEP's and HybridEP's kernels, Megatron's
# flex dispatcher over them).
DISPATCHER, NODE_FORWARDING = "moe_dispatcher", "node-forwarding"


def forwarded_copies(top_k: int, experts: ExpertLayout, groups: int = 1, topk_groups: int = 1) -> float:
    """Copies of a token an all-to-all priced per pair must move for the network to carry what a
    node-forwarding dispatcher sends: DeepEP's normal kernels send a token once to each node holding any
    of its experts and fan it out over NVLink there ("asymmetric-domain bandwidth forwarding",
    deepseek-ai/DeepEP docs/legacy.md @ 0297fc80). Over n nodes, experts spread evenly and chosen
    independently, a token reaches each other node with probability p = 1 - (1 - 1/n)^k, (n - 1) p
    nodes in all, where a per-pair all-to-all sends k (n - 1)/n of its copies across: n p copies carry
    the same network bytes (all_to_all.py prices the per-pair exchange). Inside one node nothing is
    forwarded. Group-limited routing (`topk_groups` of `groups`) caps the nodes a token reaches
    (node_reached)."""
    nodes = experts.ep_group.nodes
    if nodes <= 1:
        return float(top_k)
    return nodes * node_reached(top_k, nodes, groups, topk_groups)


def node_reached(top_k: int, nodes: int, groups: int, topk_groups: int) -> float:
    """The chance a token reaches a given node of `nodes` holding the experts in order, its top_k experts
    chosen among those of its best `topk_groups` (M) of `groups` (G) equal groups, each group's experts
    consecutive as the ranks hold them. DeepSeek-V3 lays its 8 groups on its 8 nodes and so sends each
    token to at most 4 (arXiv 2412.19437, Sections 2.1.2 and 3.2.2). A group's score is the sum of its
    best top_k / M experts' (DeepSeek-V3's inference/model.py Gate, Megatron-core's group_limited_topk),
    so the token's top_k fall on its chosen groups about evenly, top_k / M each, and every chosen group
    is reached. With g = G / n groups a node, a node is reached when any of its groups is chosen:
    p = 1 - C(G - g, M) / C(G, M); with a group over s = n / G nodes, when its group is chosen and one of
    that group's top_k / M experts is on it: p = M / G (1 - (1 - 1/s)^(top_k / M)). Groups that straddle
    nodes otherwise are not capped here: the unlimited 1 - (1 - 1/n)^k, the most it can be."""
    unlimited = 1 - (1 - 1 / nodes) ** top_k
    if topk_groups >= groups:
        return unlimited
    if groups % nodes == 0:
        mine = groups // nodes
        return 1 - math.comb(groups - mine, topk_groups) / math.comb(groups, topk_groups)
    if nodes % groups == 0:
        spread = nodes // groups
        return topk_groups / groups * (1 - (1 - 1 / spread) ** (top_k / topk_groups))
    return unlimited


def all_to_alls(
    shape: ModelShape,
    backend: Backend,
    experts: ExpertLayout,
    tokens: float,
    tp: int,
    precision: str,
    checkpointing: str,
    recipe: Recipe,
) -> list[Collective]:
    """The dispatch and combine all-to-alls of one micro-step of `tokens` tokens on a `tp`-way group:
    in the critical path, or, where the layout overlaps them (`a2a_overlap`: Megatron-core's
    `--overlap-moe-expert-parallel-comm`, which runs one micro-batch's forward beside another's
    backward), hidden behind the forward's and the backward's compute as far as it reaches."""
    dims = shape.dims
    if dims is None or dims.moe is None or experts.ep <= 1 or not dims.moe.moe_layers:
        return []
    moe = dims.moe
    again = checkpointing == "full" or "moe" in recipe.recompute_modules
    copies = moe.top_k
    if backend.options.get(DISPATCHER) == NODE_FORWARDING:
        copies = forwarded_copies(moe.top_k, experts, moe.groups, moe.topk_groups)
    sent = tokens / tp * copies * dims.width * BYTES[precision] * moe.busiest_load(recipe.moe_imbalance)
    forward, backward = moe.moe_layers * (2 + (2 if again else 0)), moe.moe_layers * 2
    group = experts.ep_group
    if not backend.options.get(A2A_OVERLAP):
        calls = forward + backward
        return [Collective(DISPATCH_WHAT, "all-to-all", sent * calls, calls, None, group, per_micro_step=True)]
    what = f"{DISPATCH_WHAT}, beside another micro-batch's compute"
    return [
        Collective(what, "all-to-all", sent * forward, forward, "forward", group, per_micro_step=True),
        Collective(what, "all-to-all", sent * backward, backward, "backward", group, per_micro_step=True),
    ]


def expert_gradient_collectives(
    shape: ModelShape, backend: Backend, experts: ExpertLayout, precision: str, gpus: int, world: Group
) -> list[Collective]:
    """The experts' gradient reduction (and ZeRO's or the distributed optimizer's gather) over the edp GPUs."""
    dims = shape.dims
    if dims is None or dims.moe is None or experts.edp <= 1 or not dims.moe.moe_layers or not backend.expert_parallel:
        return []  # a strategy without expert parallel reduces them among the rest (comm.py)
    mine = expert_shape(dims.moe, dims.width, experts.ep, experts.etp)
    reduced = collectives(mine, backend, expert_states_layout(experts), precision, gpus, 0, world)
    return [_named(c) for c in reduced]


def _named(c: Collective) -> Collective:
    return replace(c, what=f"{c.what} (experts, over the GPUs holding the same ones)")
