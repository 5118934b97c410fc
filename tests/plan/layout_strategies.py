"""Strategies that only declare a planner model, as a plugin does: each many-GPU layout the
planner knows (tensor parallel beside FSDP, hybrid sharding, ZeRO++'s hpZ and quantized
communication, torch.nn.DataParallel's threads), under names of their own. Loaded through
PARABENCH_PLUGINS, or into a registry by the tests: the planner must plan them from their
PlanModel alone."""

from __future__ import annotations

from strategies.base import Preset, Strategy
from strategies.plan_model import PlanModel


class _Declared(Strategy):
    """Planned, never run: the verbs say so."""

    listing_order = 2000

    def setup(self, model, optimizer_factory):  # noqa: ANN001
        raise NotImplementedError("a planner-only test strategy")

    backward = step = no_sync = memory_breakdown = save = load = export = teardown = setup  # type: ignore[assignment]


class TensorParallel(_Declared):
    presets = (
        Preset(
            "test-fsdp-tp",
            "FSDP over groups of tensor parallel",
            plan=PlanModel("torch", 3, "low_precision", tensor_parallel=True),
        ),
    )

    def __init__(self, ctx, *, tp_size: int = 0):  # noqa: ANN001
        super().__init__(ctx)


class HybridShard(_Declared):
    presets = (
        Preset(
            "test-hsdp",
            "FSDP inside a node, replicas across",
            plan=PlanModel("torch", 3, "low_precision", hybrid_shard=True),
        ),
    )

    def __init__(self, ctx, *, shard_size: int = 0):  # noqa: ANN001
        super().__init__(ctx)


class ZeroPlusPlus(_Declared):
    presets = (
        Preset(
            "test-zero3-hpz",
            "ZeRO-3 with hpZ",
            plan=PlanModel("deepspeed", 3, "low_precision", secondary_partition=True),
        ),
        Preset(
            "test-zero3-zeropp",
            "ZeRO-3 with hpZ, qwZ and qgZ",
            plan=PlanModel("deepspeed", 3, "low_precision", secondary_partition=True, quantized_comm=True),
        ),
    )

    def __init__(self, ctx, *, zero_hpz_partition_size: int = 0):  # noqa: ANN001
        super().__init__(ctx)


class Threads(_Declared):
    presets = (Preset("test-dataparallel", "torch.nn.DataParallel", plan=PlanModel("torch", 0, replicas="threads")),)


class Composed(_Declared):
    """torchtitan's FSDP x TP x PP x CP in one strategy, as a composed mesh takes its sizes."""

    presets = (
        Preset(
            "test-fsdp-tp-pp-cp",
            "FSDP2 inside pipeline stages, tensor and context parallel",
            plan=PlanModel("torch", 3, "low_precision", tensor_parallel=True),
        ),
    )

    def __init__(  # noqa: ANN001
        self,
        ctx,
        *,
        tp_size: int | None = None,
        pp_size: int | None = None,
        cp_size: int | None = None,
        schedule: str = "1f1b",
        microbatches: int | None = None,
    ):
        super().__init__(ctx)
