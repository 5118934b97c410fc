"""How a layout lays out a mixture of experts' routed experts: `ep` GPUs share each MoE block's
experts (E / ep each) and exchange tokens by all-to-all, `etp` GPUs split each expert's matrices
(Megatron-core's expert tensor parallel), and the GPUs of a stage that hold the same experts,

    edp = GPUs of the stage / (ep x etp)

(Megatron's "expert data parallel", DeepSpeed's expert data-parallel group, ddp-ep's dp dimension),
reduce their gradients together, and under ZeRO or a distributed optimizer share their optimizer
state. The GPUs are laid out etp, then ep, then edp (Megatron-core's parallel folding of the expert
layers, `expert_tensor_and_model_parallel` inside `expert_data_parallel`; ddp-ep's dp x ep mesh and
DeepSpeed's consecutive ranks alike): an all-to-all's GPUs are ep x etp neighbours, inside an NVLink
domain while they fit one.

The sizes are the runtime's: an expert-parallel strategy's `ep_size` (default: every data-parallel
GPU, as DeepSpeed's MoE lays it out; the torch mesh's, strategies/parallel_dims.py's, the most
data-parallel GPUs that divide the experts) must divide the GPUs (strategies/mesh_layout.py's
check_divides) and the model's experts (models/moe_config.py's check_divides_experts), each refused
in the runtime's words. A strategy without expert parallel holds every expert (ep 1) and shards or
replicates them over its data-parallel GPUs as its engine does the rest of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.plan.model.model_shape import ModelShape
from harness.plan.network.fabric import Group, Topology
from harness.plan.parallel.backends import Backend
from models.moe_config import ExpertParallelError, check_divides_experts
from strategies.mesh_layout import MeshError, check_divides

EP_OPTION, ETP_OPTION = "ep_size", "etp_size"


class ExpertLayoutError(ValueError):
    """An expert-parallel size the runtime would refuse (layout.py raises it as a LayoutError)."""


@dataclass(frozen=True)
class ExpertLayout:
    ep: int = 1  # GPUs sharing each MoE block's experts
    etp: int = 1  # GPUs splitting each expert's matrices
    edp: int = 1  # GPUs holding the same experts: their gradients reduced, their ZeRO state sharded, together
    ep_group: Group = Group(1, 1)  # the all-to-all's GPUs
    edp_group: Group = Group(1, 1)


NONE = ExpertLayout()


def _size(backend: Backend, option: str, default: int) -> int:
    return backend.options[option] if backend.size_given(option) else default


def expert_layout(backend: Backend, shape: ModelShape, topology: Topology, ranks: int, tp: int) -> ExpertLayout:
    """The experts' layout over `ranks` GPUs of a stage (tp x cp x data parallel), `tp` of them a
    tensor-parallel group; NONE for a dense model under a strategy without expert parallel."""
    moe = shape.dims.moe if shape.dims is not None else None
    if moe is None:
        if backend.expert_parallel:
            raise ExpertLayoutError(
                f"strategy {backend.name!r} shards a mixture-of-experts model's experts, and {shape.name} has none: "
                "use a model such as moe-nano, mixtral-8x7b or hf:MixtralConfig, or a strategy without expert parallel"
            )
        return NONE
    if backend.expert_parallel:
        etp = _size(backend, ETP_OPTION, 1)
        world = "the world size" if ranks == topology.gpus else "the GPUs of a pipeline stage"
        try:
            check_divides(ETP_OPTION, etp, ranks, world)
            ep = check_divides(EP_OPTION, _size(backend, EP_OPTION, ranks // etp), ranks // etp, world)
            check_divides_experts(moe.experts, ep, ranks // etp, default=not backend.size_given(EP_OPTION))
        except (MeshError, ExpertParallelError) as exc:
            raise ExpertLayoutError(f"{backend.name}: {exc}") from None
    else:  # every expert on every GPU, split as the tensor-parallel group splits the MLP
        ep, etp = 1, tp
    edp = ranks // (ep * etp)
    return ExpertLayout(ep, etp, edp, topology.block(ep, etp), topology.block(edp, ep * etp))
