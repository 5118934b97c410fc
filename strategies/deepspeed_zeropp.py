"""`zero3-hpz`, `zero3-zeropp`: DeepSpeed ZeRO-3 with ZeRO++ (arXiv 2306.10209).

hpZ (hierarchical partitioning): besides ZeRO-3's partition of the parameters over every rank,
each group of zero_hpz_partition_size ranks (by default one node) keeps a secondary copy of the
parameter shards between them, so the backward's all-gathers stay inside the group, on a
node's links, for the memory of that copy. `zero3-zeropp` adds ZeRO++'s quantized
communication: weights all-gathered in int8 (qwZ) and gradients reduce-scattered in int4 (qgZ).
DeepSpeed runs those quantization kernels on GPUs only; on a CPU the name is skipped with that
reason. hpZ itself runs over gloo.

Everything else is `zero3`'s (strategies/deepspeed.py): the config layers, the runner's AdamW,
DeepSpeed's own checkpoints, which hpZ writes as ZeRO-3 does (the secondary copy is rebuilt
from the primary partitions), so zero3 and zero3-hpz load each other's at the same world size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import Preset, RunContext
from strategies.deepspeed import DeepSpeedStrategy
from strategies.deepspeed_config import DeepSpeedConfigError
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from strategies.base import OptimizerFactory
    from strategies.parallel_dims import ModelFacts

# The ZeRO++ settings of DeepSpeed's zero_optimization section, which these names fix.
HPZ_KEY = "zero_hpz_partition_size"
QUANTIZED_KEYS = ("zero_quantized_weights", "zero_quantized_gradients")


def _zeropp(name: str, description: str, quantized: bool) -> Preset:
    options = {"stage": 3, "offload_optimizer": False, "offload_params": False, "quantized_comm": quantized}
    plan = PlanModel("deepspeed", 3, "low_precision", secondary_partition=True, quantized_comm=quantized)
    return Preset(name, description, options, plan)


class ZeroPlusPlusStrategy(DeepSpeedStrategy):
    description = "DeepSpeed ZeRO-3 with ZeRO++"
    presets = (
        _zeropp(
            "zero3-hpz",
            "DeepSpeed ZeRO-3 + ZeRO++ hpZ: a secondary copy of the parameter shards inside each node",
            quantized=False,
        ),
        _zeropp(
            "zero3-zeropp",
            "DeepSpeed ZeRO-3 + ZeRO++ hpZ, int8 weight all-gathers (qwZ) and int4 gradient reduce-scatters (qgZ)",
            quantized=True,
        ),
    )
    listing_order = 31

    def __init__(
        self,
        ctx: RunContext,
        *,
        zero_hpz_partition_size: int | None = None,
        quantized_comm: bool = False,
        stage: int = 3,
        offload_optimizer: bool = False,
        offload_params: bool = False,
        cpu_adam: bool | None = None,
    ):
        super().__init__(
            ctx, stage=stage, offload_optimizer=offload_optimizer, offload_params=offload_params, cpu_adam=cpu_adam
        )
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {HPZ_KEY: zero_hpz_partition_size})
        self.hpz_size = self.mesh.shape[self.mesh.dims.index("hpz")]
        zero = self.run_config["zero_optimization"]
        zero[HPZ_KEY] = self.hpz_size
        for key in QUANTIZED_KEYS:
            zero[key] = bool(quantized_comm)
        self._refuse_contradicting_user_settings()

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        return hpz_layout(world_size, local_world_size, options.get(HPZ_KEY))

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        if options.get("quantized_comm") and device_type != "cuda":
            return (
                "DeepSpeed's ZeRO++ quantization kernels (qwZ, qgZ) run on GPUs only ('This op had not been "
                "implemented on CPU backend'): run it on GPUs, or compare zero3-hpz here"
            )
        return None

    def _refuse_contradicting_user_settings(self) -> None:
        source = getattr(self.ctx.config, "deepspeed_config", None) or ""
        user = self.user_config.get("zero_optimization", {})
        zero = self.run_config["zero_optimization"]
        for key in (HPZ_KEY, *QUANTIZED_KEYS):
            if key in user and user[key] != "auto" and user[key] != zero[key]:
                fix = f"strategy_options.{HPZ_KEY}=" if key == HPZ_KEY else "strategy=zero3-hpz or zero3-zeropp"
                raise DeepSpeedConfigError(
                    f"deepspeed_config {source} sets zero_optimization.{key}={user[key]} but the strategy runs "
                    f"{zero[key]}: set it with {fix} instead"
                )

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        engine, optimizer = super().setup(model, optimizer_factory)
        quantized = self.run_config["zero_optimization"][QUANTIZED_KEYS[0]]
        extra = " + qwZ int8 weights, qgZ int4 gradients" if quantized else ""
        self.layout = f"zero3 + hpZ secondary partition over {self.hpz_size} ranks{extra}; {self.layout}"
        return engine, optimizer

    def teardown(self) -> None:
        from deepspeed.utils import groups

        super().teardown()
        # DeepSpeed keeps the hpZ group in a module global that every later ZeRO-3 engine in the
        # process would take as its own secondary partition (a probe or a test running several).
        group = groups._get_zero_param_intra_parallel_group()
        if group is not None:
            groups._release_process_group_references(group)


def hpz_layout(world_size: int, local_world_size: int, hpz_size: int | None) -> MeshLayout:
    """groups x hpz: ZeRO-3 partitions over every rank; each group of hpz ranks (by default one
    node's) holds a secondary copy of the parameter shards. Every rank reads its own data."""
    hpz = check_divides(HPZ_KEY, local_world_size if hpz_size is None else hpz_size, world_size)
    groups = world_size // hpz
    notes = []
    if groups == 1:
        notes.append(
            "one group: the secondary copy spans every rank as the primary partition does: zero3's traffic, more memory"
        )
    if hpz == 1:
        notes.append("hpz 1: no secondary partition, as zero3")
    return MeshLayout((groups, hpz), ("groups", "hpz"), ("groups", "hpz"), tuple(notes))
