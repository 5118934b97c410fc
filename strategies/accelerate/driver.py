"""What every Accelerate mode shares: an `Accelerator` configured in code (mixed precision
from the run's precision, accumulation from its micro-batching, the engine's plugin from the
mode's class), the loop's verbs through it, and Accelerate's own checkpoints.

Under `accelerate launch` Accelerate takes its own settings from the ACCELERATE_* environment
the launcher sets, and settings that contradict the chosen strategy name or the run are
refused in one line (environment.py). `accelerate:<file.yaml>` runs a user's own config the same
way: the settings `accelerate launch` would set from it are made by Accelerate's launch code and
set while the run's Accelerator lives (accelerate_file.py). Either way it reuses the process group the runner
created; Accelerate's state is checked to agree with it.

Checkpoints are Accelerate's own `save_state`/`load_state` directories, one format per
mode: under ddp the wrapped model's state dict and the optimizer's (rank 0), under fsdp
what Accelerate's FSDP2 plugin writes (a full state dict by default, DCP shards with
fsdp_state_dict_type: SHARDED_STATE_DICT), under zero1-3 DeepSpeed's checkpoint
(engine.save_checkpoint, tag "pytorch_model"), which, as for `zero1-3`, only the same world
size loads. Accelerate's per-rank RNG files ride along; the checkpoint manager restores
every generator after them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Iterator

from strategies.accelerate.accelerate_file import AccelerateFile
from strategies.accelerate.environment import (
    ACCELERATE_PRECISION,
    AccelerateEnvironment,
    check_launcher_settings,
    launched_by_accelerate,
)
from strategies.accelerate.tied_parameters import check_still_shared, shared_parameters
from strategies.base import OptimizerFactory, RunContext, Strategy, StrategyError, missing_package_reason
from strategies.config_files import FileChoice

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from accelerate import Accelerator, ParallelismConfig

    from models.blocks import Blocks
    from strategies.memory import MemoryBreakdown

# What Accelerate's save_state writes (accelerate.utils.constants), by mode: the offline
# reader tells the modes apart by these names alone.
DEEPSPEED_TAG = "pytorch_model"  # save_state's ckpt_id for the first (only) DeepSpeed model
DDP_WEIGHTS = "pytorch_model.bin"
FSDP_FULL_WEIGHTS = "pytorch_model_fsdp.bin"
FSDP_SHARDED_WEIGHTS = "pytorch_model_fsdp_0"


class AccelerateStrategy(Strategy):
    """The shared driver; each mode's class says which engine Accelerate drives and how."""

    description = "Hugging Face Accelerate"
    listing_order = 40
    # The distributed type Accelerate must choose for this mode (None: whatever DDP it picks).
    distributed_type: str | None = None
    config_file_kind = "accelerate"  # `accelerate:<file.yaml>`
    backend_modules = ("accelerate",)

    def __init__(self, ctx: RunContext):
        file = ctx.config_file
        self.file = AccelerateFile.read(file.path, file.label) if file is not None else None
        # What `accelerate launch --config_file` would set from the file (None: no file, the process's own).
        self._file_env: dict[str, str] | None = None
        # The DeepSpeed JSON the file names, its scheduler filled from the run (None: no such JSON).
        self._file_deepspeed_json: dict[str, Any] | None = None
        followed: list[str] = []
        if self.file is not None:  # the file may split the batch its own way: the context says so from here on
            ctx, followed, self._file_env, self._file_deepspeed_json = self.file.for_run(ctx)
        super().__init__(ctx)
        self.followed = followed
        check_launcher_settings(os.environ if self._file_env is None else self._file_env, self.mode, ctx)
        # Each mode writes its own layout.
        self.checkpoint_format = f"accelerate-{self.mode}"
        self.accelerator: Accelerator | None = None
        self.lr_scheduler: Any = None  # what prepare() made of _schedulers()
        self._environment: AccelerateEnvironment | None = None

    @property
    def mode(self) -> str:
        """The mode's name as `accelerate launch` configs call it (ddp, fsdp, zero1-3)."""
        raise NotImplementedError

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return missing_package_reason("accelerate", "pip install accelerate")

    @classmethod
    def resolve_config_file(cls, path: Path) -> FileChoice:
        return AccelerateFile.read(path, f"{cls.config_file_kind}:{path}").choice()

    # ---- what each mode adds ------------------------------------------------------------

    def _plugins(self, model: nn.Module) -> dict[str, Any]:
        """The engine's plugin, as Accelerator's keyword arguments."""
        return {}

    def _handlers(self) -> list[Any]:
        """Accelerate's kwargs handlers this mode needs."""
        return []

    def _parallelism_config(self) -> ParallelismConfig | None:
        """Accelerate's ParallelismConfig of the mode's mesh (hsdp, fsdp-tp); None: none."""
        return None

    def _after_build(self, accelerator: Accelerator, plugins: dict[str, Any]) -> None:
        """Anything the mode must do once the Accelerator exists, before prepare()."""

    def _before_optimizer(self, model: nn.Module) -> None:
        """Anything to do to the model on the device before its optimizer is built (tensor parallel)."""

    def _schedulers(self, optimizer: torch.optim.Optimizer) -> list[Any]:
        """What the mode hands prepare() beside the model and the optimizer (a DeepSpeed JSON's scheduler)."""
        return []

    def _after_prepare(self) -> None:
        """Anything the mode must do once prepare() has wrapped the model (and any scheduler: self.lr_scheduler)."""

    def _layout(self, blocks: Blocks) -> str | None:
        return None

    def _mode_detail(self) -> str:
        return str(self.accelerator.distributed_type).split(".")[-1]

    # ---- setup -------------------------------------------------------------------------

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        import torch.distributed as dist

        runner_group = dist.group.WORLD
        self.accelerator = self._build_accelerator(model)
        if dist.group.WORLD is not runner_group:
            raise StrategyError(
                "Accelerate replaced the runner's process group: launch with torchrun or accelerate launch"
            )
        self._check_state_matches_runner()
        if self.ctx.rank == 0:
            print(self._mode_line(), flush=True)
        self.say_followed()
        # On the device before the optimizer exists, so that it is built there (fused AdamW on CUDA).
        model = model.to(self.ctx.device)
        self._before_optimizer(model)
        optimizer = optimizer_factory(model)
        blocks = self.find_blocks(model)  # before ZeRO-3 empties the parameters into its partitions
        shared = shared_parameters(model)
        prepared = self.accelerator.prepare(model, optimizer, *self._schedulers(optimizer))
        self.model, self.optimizer, *schedulers = prepared
        self.lr_scheduler = schedulers[0] if schedulers else None
        check_still_shared(shared, self.accelerator.unwrap_model(self.model), self.mode)
        self._after_prepare()
        self.layout = self._layout(blocks)
        return self.model, self.optimizer

    def _build_accelerator(self, model: nn.Module) -> Accelerator:
        import torch.distributed as dist
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        # The mode's ParallelismConfig (hsdp, fsdp-tp), made while the environment is still the launch's:
        # under `accelerate launch` its sizes are checked against the ones the launch set.
        parallelism = self._parallelism_config()
        launch = dict(self._file_env or {})
        if self.ctx.device.type == "cpu":
            # Told by this flag, Accelerate would build a ParallelismConfig from the launch's sizes and check
            # it before FSDP is on, and refuse it ("got DistributedType.NO"); the mode attaches the same sizes
            # (its mesh) once it is, as for its own. A file's flag is not set, a launcher's set false meanwhile.
            launch.pop("ACCELERATE_USE_PARALLELISM_CONFIG", None)
            if os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").strip().lower() == "true":
                launch["ACCELERATE_USE_PARALLELISM_CONFIG"] = "false"
        self._environment = AccelerateEnvironment(launch)
        plugins = self._plugins(model)
        handlers = self._handlers()
        if self.ctx.device.type == "cpu":
            # Told the backend of the group that already exists, Accelerate counts the
            # ranks from it; left to guess on a CPU, it sees a world of one.
            timeout = timedelta(seconds=getattr(self.ctx.config, "pg_timeout_s", 1800))
            handlers.append(InitProcessGroupKwargs(backend=dist.get_backend(), timeout=timeout))
        # On a CPU, Accelerate refuses a ParallelismConfig before FSDP is switched on (its FSDP is
        # for accelerators): the FSDP mode attaches it after that (environment.py); on a GPU, as its users do.
        given = parallelism if self.ctx.device.type != "cpu" else None
        # DeepSpeed's notices (the CPU communication op it builds when Accelerate starts it) print on
        # stdout, which carries the run's own lines: to stderr, with the rest of what the libraries say.
        with contextlib.redirect_stdout(sys.stderr):
            accelerator = Accelerator(
                mixed_precision=ACCELERATE_PRECISION[self.ctx.precision],
                parallelism_config=given,
                gradient_accumulation_steps=self.ctx.grad_accum,
                # MULTI_CPU (gloo DDP) is what cpu=True means; it would also drop FSDP and DeepSpeed.
                cpu=self.distributed_type is None and self.ctx.device.type == "cpu",
                kwargs_handlers=handlers,
                **plugins,
            )
        self._after_build(accelerator, plugins)
        return accelerator

    def _check_state_matches_runner(self) -> None:
        """Accelerate must see the runner's world, not build its own."""
        acc, ctx = self.accelerator, self.ctx
        if (acc.num_processes, acc.process_index) != (ctx.world_size, ctx.rank):
            raise StrategyError(
                f"Accelerate sees rank {acc.process_index} of {acc.num_processes} but the launcher started rank "
                f"{ctx.rank} of {ctx.world_size}: launch with torchrun, accelerate launch or nproc=N, not a mix"
            )
        if acc.device.type != ctx.device.type or (ctx.device.type == "cuda" and acc.device != ctx.device):
            raise StrategyError(
                f"Accelerate placed this rank on {acc.device} but the run uses {ctx.device}: use device=auto"
            )
        chosen = str(acc.distributed_type).split(".")[-1]
        if self.distributed_type is None and ctx.world_size > 1 and not acc.use_distributed:
            raise StrategyError(f"Accelerate chose {chosen} for {ctx.world_size} processes, not DDP")
        if self.distributed_type is not None and chosen != self.distributed_type:
            raise StrategyError(
                f"Accelerate chose {chosen} although accelerate-{self.mode} asks for {self.distributed_type}: "
                "check the accelerate config (accelerate env) against configs/accelerate/"
            )

    def _mode_line(self) -> str:
        acc = self.accelerator
        if self.file is not None:
            source = f"accelerate config {self.file.path.name}"
        else:
            source = "accelerate launch config" if launched_by_accelerate(os.environ) else "configured in code"
        return (
            f"accelerate: mode {self.mode} ({source}): {self._mode_detail()}, {acc.num_processes} "
            f"process{'es' if acc.num_processes != 1 else ''}, "
            f"mixed_precision {acc.mixed_precision}, gradient_accumulation_steps {acc.gradient_accumulation_steps}"
        )

    # ---- the loop's verbs -----------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        # Accelerate divides by gradient_accumulation_steps (DeepSpeed's engine does, under DeepSpeed);
        # at a boundary (sync_gradients) its DeepSpeed path also runs the engine's step.
        self.accelerator.backward(loss)

    def clip_gradients(self) -> None:
        if self.ctx.grad_clip > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.ctx.grad_clip)

    def step(self) -> None:
        self.clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def _accumulating(self) -> Iterator[None]:
        """What `Accelerator.accumulate` does on a micro-step that is not a boundary."""
        acc = self.accelerator
        acc.sync_gradients = False  # no DeepSpeed step and no reduction boundary on this micro-step
        try:
            with acc.no_sync(self.model):
                yield
        finally:
            acc.sync_gradients = True

    def no_sync(self) -> ContextManager:
        return self._accumulating()

    # ---- checkpoints ----------------------------------------------------------------------

    def save(self, path: Path) -> None:
        assert self.accelerator is not None, "setup() first"
        # A pickle rather than safetensors: safetensors would drop one of the tied names
        # (lm_head.weight) with a warning at every save.
        self.accelerator.save_state(str(path), safe_serialization=False)

    def load(self, path: Path) -> None:
        assert self.accelerator is not None, "setup() first"
        self.accelerator.load_state(str(path))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        assert self.model is not None, "setup() first"
        # Strips DDP's "module." prefix and gathers FSDP2's shards; rank 0 keeps the result.
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.ctx.rank == 0 else {}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        assert self.model is not None, "setup() first"
        # A copy: under DDP, set_model_state_dict renames the keys of the dict it is given in place.
        set_model_state_dict(self.model, dict(state), options=StateDictOptions(full_state_dict=True, strict=True))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        import torch

        if (path / DEEPSPEED_TAG).is_dir():
            from strategies.deepspeed import read_zero_checkpoint

            return read_zero_checkpoint(path, DEEPSPEED_TAG)
        if (path / DDP_WEIGHTS).is_file():
            state = torch.load(path / DDP_WEIGHTS, map_location="cpu", weights_only=True)
            return {name.removeprefix("module."): t for name, t in state.items()}  # DDP's wrapper prefix
        if (path / FSDP_FULL_WEIGHTS).is_file():
            return torch.load(path / FSDP_FULL_WEIGHTS, map_location="cpu", weights_only=True)
        if (path / FSDP_SHARDED_WEIGHTS).is_dir():
            from strategies.fsdp import FSDPStrategy

            return FSDPStrategy.read_full_state_dict(path / FSDP_SHARDED_WEIGHTS, model)
        raise StrategyError(
            f"{path} holds none of the files Accelerate's save_state writes: give a checkpoint an "
            "accelerate-* strategy wrote"
        )

    # ---- measurement and teardown -----------------------------------------------------------

    def memory_breakdown(self) -> MemoryBreakdown:
        from strategies.memory import MemoryBreakdown

        return MemoryBreakdown.of(self.model, innermost_optimizer(self.optimizer))

    def teardown(self) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
            self.accelerator = None
        # Also when setup failed after Accelerate set its process-wide state: the next run in the
        # process (a probe, a test) must not inherit this one's distributed type.
        if self._environment is not None:
            self._environment.restore()
            self._environment = None
        super().teardown()


def innermost_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer under Accelerate's (and DeepSpeed's) wrappers, which holds the state."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer
