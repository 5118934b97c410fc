"""The one training interface every backend implements.

The runner's loop holds a `Strategy` and never asks which one: setup wraps the
model and builds the optimizer, backward/step/no_sync drive accumulation, and
memory_breakdown reports what this rank holds. Checkpoint verbs: save/load in the
backend's own format (exact resume), full_state_dict/load_full_state_dict for the
consolidated weights, read_full_state_dict to get those weights out of a checkpoint
offline (export, and resuming under a strategy whose format differs).

A strategy over a mesh of several dimensions (hsdp, fsdp-tp) declares it with mesh_layout
before any process exists; the loop then reads its data by `data_parallel`, so that the ranks
of a tensor-parallel group see the same micro-batch.
"""

from __future__ import annotations

import contextlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

from strategies.mesh_layout import MeshLayout
from strategies.plan_model import PlanModel

# torch is imported where a strategy runs, not where it is declared: `runner.py list` and
# `runner.py plan` read every strategy's presets without paying for it.
if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.blocks import Blocks
    from strategies.config_files import ConfigFile, FileChoice
    from strategies.memory import MemoryBreakdown
    from strategies.parallel_dims import ModelFacts

OptimizerFactory = Callable[["nn.Module"], "torch.optim.Optimizer"]
"""Builds the run's optimizer over a (wrapped or sharded) model's parameters."""


def compute_precision(precision: str) -> str:
    """The precision of everything a run computes but fp8's float8 matmuls (strategies/float8.py):
    its dtype, its rounding and the peak its MFU counts against. fp8 answers as bf16."""
    return "bf16" if precision == "fp8" else precision


def torch_dtype(precision: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[compute_precision(precision)]


def missing_package_reason(module: str, install: str) -> str | None:
    """The unavailable_reason of a plugin whose backend package may be absent."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed: {install}"
    return None


def compile_blocks(model: nn.Module, blocks: Blocks) -> str:
    """torch.compile each block in place, as torchtitan does under FSDP: a block compiles
    once for all its copies, and the backend's per-block hooks (all-gather, reshard, ZeRO-3
    fetch and release) stay between the graphs. A model without blocks compiles whole."""
    for module in blocks.modules or (model,):
        module.compile()
    return f"per block ({blocks.describe()})" if blocks.modules else "whole model"


class StrategyError(ValueError):
    """A strategy that cannot run as asked (one line, says what to do)."""


class ModelUnsupported(StrategyError):
    """The strategy cannot lay out this model (its form, not a mistake in the input): a compare
    skips the strategy with this reason and runs the rest; a lone run stops with it."""


def no_checkpoints_error(name: str) -> StrategyError:
    """The refusal of a run that asks a backend without checkpoints (checkpoint_format "") for them."""
    return StrategyError(
        f"strategy {name!r} cannot save or load checkpoints yet: run it with checkpoint_every=0 and no resume="
    )


@dataclass(frozen=True)
class Preset:
    """One name a strategy class registers: what the name means (the options it fixes), in
    words for `runner.py list` and the report, and to the planner."""

    name: str
    description: str
    options: dict[str, Any] = field(default_factory=dict)
    plan: PlanModel | None = None  # None: the planner has no model of it, and says so
    # The options a run may set under this name (None: every keyword option of the class the name
    # does not fix), for a class whose names take different options (the torch mesh's presets).
    takes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RunContext:
    """What a strategy needs to know about the run it serves."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    precision: str  # fp32 | bf16 | fp16 | fp8
    micro_batch: int
    grad_accum: int
    grad_clip: float  # 0: no clipping
    config: Any = None  # the whole RunConfig, for backends that build their own config from it
    # The strategy's layout of the ranks (Strategy.mesh_layout); None: the flat default.
    mesh: MeshLayout | None = None
    # The user's own config file the strategy runs from (`accelerate:<file.yaml>`: strategies/config_files.py),
    # set by the registry; None: the built-in's own settings.
    config_file: ConfigFile | None = None
    # The run's learning-rate schedule as the loop resolved it (harness/train/optimizer.py Schedule: lr, min_lr,
    # warmup_steps, shape, warmup_type, at(step, steps), describe()), for a backend that runs a scheduler of its
    # own to check against it; None where no run resolved one.
    schedule: Any = None

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.precision)


class Strategy(ABC):
    """One backend behind the runner's verbs. Subclasses register one or more names."""

    name: str = ""
    description: str = ""
    # The names this class registers, each with the options it fixes and its planner model.
    presets: ClassVar[tuple[Preset, ...]] = ()
    # Where the class's names come in `runner.py list`, a compare's default sweep and its colours:
    # the reference first, then plain torch, DeepSpeed, Accelerate; plugins after the built-ins.
    listing_order: ClassVar[int] = 1000
    # Checkpoints of equal format load natively (model, optimizer, scaler) across strategies;
    # "" means the backend cannot checkpoint yet, and a run that asks it to is refused up front.
    checkpoint_format: ClassVar[str] = ""
    # Whether load() accepts a checkpoint saved by another number of ranks.
    checkpoint_reshards: ClassVar[bool] = True
    # Runs as one process whatever the compare's process count: the reference, and DataParallel,
    # which drives every visible GPU from one process. Read from the class that declares it, not
    # inherited (ddp and fsdp reuse single's plain-torch verbs but run a process per device).
    one_process: ClassVar[bool] = False
    # precision=fp8 (strategies/float8.py): whether the class trains torchao's float8 linear layers, and
    # whether it shards them with FSDP2, which can all-gather their weights in float8.
    trains_fp8: ClassVar[bool] = False
    gathers_fp8: ClassVar[bool] = False
    # The kind of config file this class (and its subclasses) can run as `<kind>:<path>`
    # (strategies/config_files.py); None: none.
    config_file_kind: ClassVar[str | None] = None
    # The packages setup() imports: each worker imports them before setup(), and a launcher
    # forking its workers from one process (a CPU run) imports them there once for all of them.
    backend_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        # What the backend did with the model's blocks (its FSDP units, the blocks its hooks
        # work through), set by setup() for the run's header and summary; None: nothing per block.
        self.layout: str | None = None
        # How the ranks are laid out: the run's (from mesh_layout), else the flat default.
        self.mesh: MeshLayout = ctx.mesh or MeshLayout.flat(ctx.world_size)
        # What the strategy followed of its config file (ctx.config_file), in words: said at setup.
        self.followed: list[str] = []

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run here (a missing package), or None when it can."""
        return None

    @classmethod
    def resolve_config_file(cls, path: Path) -> FileChoice:
        """What the config file at `path` (of this class's config_file_kind) amounts to: the built-in
        name that runs it; a StrategyError (one line, naming the key) where no built-in can."""
        raise StrategyError(f"{cls.__name__} runs no config files")

    @classmethod
    def recovers_from_oom(cls, options: dict[str, Any]) -> bool:
        """Whether, with these preset options, teardown() after an out-of-memory error frees
        everything setup() and the steps built, leaving no global state or buffers behind: the
        batch search then tries one micro-batch after another in one process (at world size 1;
        harness/compare/probe.py checks the freeing after every probe and falls back if it fails)."""
        return False

    @classmethod
    def takes_deepspeed_config(cls, config_file: ConfigFile | None) -> bool:
        """Whether a run's `deepspeed_config=<file.json>` reaches this backend, merged over the DeepSpeed
        config it builds; `config_file`: the file the run's name gives it (`deepspeed:<file>`), if any.
        False for a backend that runs no DeepSpeed: train refuses the option there, and a compare gives it
        only to the strategies that take it."""
        return False

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        """Why this backend, with these options (the run's, then its preset's), cannot run on
        `device_type` ("cpu" or "cuda"), or None when it can. Compare skips such names with the
        reason, preflight refuses them."""
        return None

    def devices(self) -> list[torch.device]:
        """The devices this process computes on: its own, or every GPU a backend drives from one
        process. MFU counts the peak of each, and peak memory is the largest among them."""
        return [self.ctx.device]

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        """How this name, with these options, lays out `world_size` ranks, `local_world_size` of them
        on each node, for a model of these facts (its blocks and heads, where known); a MeshError
        (one line) where it cannot. By default one dimension, every rank a data-parallel rank."""
        return MeshLayout.flat(world_size)

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(this rank's data-parallel rank, the data-parallel degree): which micro-batch it reads."""
        return self.mesh.data_parallel(self.ctx.rank)

    def say_followed(self) -> None:
        """On rank 0, what the strategy followed of its config file, a line each."""
        if self.ctx.rank == 0 and self.ctx.config_file is not None:
            for line in self.followed:
                print(f"{self.ctx.config_file.label}: {line}", flush=True)

    @classmethod
    def fp8_refusal(cls, options: dict[str, Any]) -> str | None:
        """Why this class, with these preset options, cannot train with precision=fp8 (a compare
        skips it with this), or None."""
        if cls.trains_fp8:
            return None
        return "does not train torchao's float8 linear layers: compare it with precision=bf16"

    def check_model(self, model: nn.Module) -> None:
        """Refuse, in one line, a model this backend cannot lay out as asked (before any worker
        starts: preflight calls it on the model built on the meta device). Any model will do here."""
        return None

    def find_blocks(self, model: nn.Module) -> Blocks:
        """The model's blocks as the run names or finds them (models/blocks.py)."""
        from models.blocks import find_blocks

        return find_blocks(model, getattr(self.ctx.config, "model_blocks", None))

    def compile(self, model: nn.Module) -> str:
        """compile=true, before setup: torch.compile `model` in place, so its state-dict
        names stay plain; returns what was compiled, for the run's summary. By default the
        whole forward, loss included, is one graph (the head's matmul fuses with the
        cross-entropy), as in nanoGPT's compiled loop; backends that wrap or hook the model
        block by block compile per block instead (compile_blocks)."""
        model.compile()
        return "whole model"

    @abstractmethod
    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Move, wrap or shard `model` and build its optimizer; returns what the loop calls."""

    def autocast(self) -> ContextManager:
        """Context for the forward pass (mixed precision where the backend uses autocast)."""
        return contextlib.nullcontext()

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-step's mean loss; the strategy scales by 1/grad_accum."""

    @abstractmethod
    def step(self) -> None:
        """Clip, optimizer step and zero the gradients, once per global step."""

    def no_sync(self) -> ContextManager:
        """Context for every micro-step but the last: skip the gradient reduction."""
        return contextlib.nullcontext()

    def set_lr(self, lr: float) -> None:
        assert self.optimizer is not None, "setup() first"
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def memory_breakdown(self) -> MemoryBreakdown:
        """Bytes this rank holds in parameters, gradients and optimizer state."""
        from strategies.memory import MemoryBreakdown

        assert self.model is not None, "setup() first"
        return MemoryBreakdown.of(self.model, self.optimizer)

    def save(self, path: Path) -> None:
        """Collective: write model, optimizer and gradient-scaler state into the directory
        `path` (which exists) in the backend's own format. Every rank calls it."""
        raise self._no_checkpoints()

    def load(self, path: Path) -> None:
        """Collective: restore what save() wrote into `path`, after setup()."""
        raise self._no_checkpoints()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the consolidated model state on the CPU, with the bare model's parameter
        names, on rank 0 (an empty dict on the other ranks)."""
        raise self._no_checkpoints()

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Collective: load consolidated weights (every rank passes the whole dict) into the
        set-up model; the optimizer state is left as it is."""
        raise self._no_checkpoints()

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        """Offline, in one process without a process group: the consolidated weights in the
        checkpoint directory `path` that save() wrote, keyed like `model.state_dict()`.
        `model` is a bare model of the checkpoint's shape, for formats that read into a
        template; its values are not used."""
        raise StrategyError(f"strategy {cls.name or cls.__name__!r} cannot read its checkpoints back")

    def _no_checkpoints(self) -> StrategyError:
        return no_checkpoints_error(self.name)

    def teardown(self) -> None:
        """Release what setup built (the process group belongs to the runner)."""
        self.model = None
        self.optimizer = None
