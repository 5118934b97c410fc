"""`zero1`, `zero2`, `zero3`, `zero2-offload`, `zero3-offload`: DeepSpeed ZeRO.

One class, five names. The DeepSpeed config is built in code from the run
(strategies/deepspeed_config.py); the optimizer is the runner's own torch AdamW, so
the learning rate (set by the runner every step) and clipping match every other
strategy. No FusedAdam (DeepSpeed would JIT-build it with nvcc, which fails on some GPU
images). DeepSpeed's own scheduler runs only where a user's JSON has one that is the run's
schedule (strategies/deepspeed_file.py): it then sets the learning rate, and every step
checks it is the one the runner's schedule has. Under optimizer offload on a GPU the same
AdamW groups are handed to DeepSpeedCPUAdam, DeepSpeed's vectorised host optimizer
(a C++-only JIT build, no nvcc); on a CPU-only run, where offload moves nothing,
torch AdamW steps the partitions and nothing is built.

`deepspeed:<file.json>` runs a user's DeepSpeed JSON as one of these names, chosen by its stage
and offload (strategies/deepspeed_file.py): the file is then the top layer of the config.

Accumulation is DeepSpeed's own: engine.backward scales by 1/grad_accum, and the
micro-step counter DeepSpeed keeps in engine.step() is advanced after every micro-step
but the last, so its accumulation boundary falls on the runner's last micro-step.

Checkpoints are DeepSpeed's own (engine.save_checkpoint under one fixed tag): every
rank writes its optimizer partition, and the fp32 master weights come back exactly.
They are read back only by the same ZeRO stage at the same world size: DeepSpeed
0.19.8 refuses another data-parallel size for plain ZeRO checkpoints (resharding needs
its offline universal-checkpoint conversion, which parabench does not run), and
ZeRO-3 partitions its state unlike ZeRO-1/2. Export and a resume under any other
strategy read the consolidated fp32 weights offline with deepspeed.utils.zero_to_fp32.

deepspeed is imported lazily: this module loads (and the names are listed, as
unavailable) where deepspeed is not installed.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from strategies import deepspeed_file
from strategies.base import (
    OptimizerFactory,
    Preset,
    RunContext,
    Strategy,
    StrategyError,
    compile_blocks,
    missing_package_reason,
)
from strategies.config_files import FileChoice
from strategies.deepspeed_config import (
    check_user_config,
    check_zero_options,
    final_config,
    model_size,
    read_user_config,
    run_config,
    sizing_config,
)
from strategies.memory import MemoryBreakdown
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.blocks import Blocks
    from strategies.config_files import ConfigFile

CONFIG_FILE = "deepspeed_config.json"  # written to the run's out_dir
CHECKPOINT_TAG = "zero"  # the sub-directory of state/ that engine.save_checkpoint writes
# DeepSpeed's buffers, by the attribute names its ZeRO optimizers (stage_1_and_2.py,
# stage3.py, and bf16_optimizer.py, which DeepSpeed picks for ZeRO-1 in bf16 with
# data_types.grad_accum_dtype=fp32) keep them under; an attribute absent is skipped.
PARAM_BUFFERS = (
    "bit16_groups_flat",  # ZeRO-1/2: the whole model's parameters, flat, on every rank
    "param_buffer_of_bit16_for_cpu_offload_groups",  # ZeRO-1/2 offload: host copy of the partition
    "fp16_partitioned_groups_flat",  # ZeRO-3: this rank's partitions (the ds_tensors), flat
    "param_groups_fp16_flat_cpu_memory",  # ZeRO-3 parameter offload: the partitions on the host
    "bf16_groups_flat",  # BF16_Optimizer: the whole model, flat
)
MASTER_BUFFERS = (
    "single_partition_of_fp32_groups",  # ZeRO-1/2: this rank's fp32 master partition
    "fp32_partitioned_groups_flat",  # ZeRO-3: the same (the optimizer's param_groups hold it only during step)
    "fp32_groups_flat_partition",  # BF16_Optimizer: the same
)
GRAD_BUFFERS = (
    "averaged_gradients",  # this rank's reduced gradient partitions
    "grads_in_partition",  # ZeRO-2 contiguous gradient partition
    "accumulated_grads_in_cpu",  # ZeRO-1/2 offload: gradients accumulated on the host
    "temp_grad_buffer_for_cpu_offload",
    "temp_grad_buffer_for_gpu_offload",
    "grad_partitions_flat_buffer",  # ZeRO-3: every partition's gradient, flat
    "ipg_buckets",  # the reduction buckets gradients are copied into before reducing
    "fp32_groups_gradients_flat",  # BF16_Optimizer: the whole model's fp32 gradients
)


def _zero(name: str, description: str, stage: int, offload: bool = False) -> Preset:
    """A ZeRO name: it fixes the stage and both offloads (zero2 is never offloaded)."""
    options = {"stage": stage, "offload_optimizer": offload, "offload_params": offload and stage == 3}
    plan = PlanModel(
        "deepspeed", stage, "low_precision", offload_optimizer=offload, offload_params=offload and stage == 3
    )
    return Preset(name, description, options, plan)


class DeepSpeedStrategy(Strategy):
    description = "DeepSpeed ZeRO"
    presets = (
        _zero("zero1", "DeepSpeed ZeRO-1: optimizer state sharded", 1),
        _zero("zero2", "DeepSpeed ZeRO-2: optimizer state and gradients sharded", 2),
        _zero("zero3", "DeepSpeed ZeRO-3: parameters, gradients, optimizer state sharded", 3),
        _zero("zero2-offload", "DeepSpeed ZeRO-2, optimizer state on the CPU", 2, offload=True),
        _zero("zero3-offload", "DeepSpeed ZeRO-3, parameters and optimizer state on the CPU", 3, offload=True),
    )
    listing_order = 30
    config_file_kind = "deepspeed"  # `deepspeed:<file.json>`
    backend_modules = ("deepspeed",)
    checkpoint_format = "deepspeed"  # the family; each instance narrows it to its stage
    # Plain ZeRO checkpoints hold one optimizer partition per rank, and DeepSpeed refuses to
    # load them at another data-parallel size (it would need a universal checkpoint).
    checkpoint_reshards = False

    @classmethod
    def recovers_from_oom(cls, options: dict) -> bool:
        """ZeRO-1/2 free what they built (seen on the CPU, and checked after every probe); ZeRO-3 keeps
        the model in a module-level stack of its hooks (deepspeed.runtime.zero.parameter_offload
        FWD_MODULE_STACK) and offload keeps pinned host buffers: each of their probes gets a process."""
        return options.get("stage") in (1, 2) and not options.get("offload_optimizer")

    def __init__(
        self,
        ctx: RunContext,
        *,
        stage: int = 1,
        offload_optimizer: bool = False,
        offload_params: bool = False,
        cpu_adam: bool | None = None,
    ):
        file, followed = ctx.config_file, []
        self.scheduler: dict[str, Any] | None = None  # a file's scheduler section, filled: DeepSpeed steps it
        if file is not None:  # the file may split the batch its own way: the context says so from here on
            file_config, ctx, followed = deepspeed_file.for_run(deepspeed_file.read(file.path), ctx, file.label)
            self.scheduler = file_config.pop("scheduler", None)
        super().__init__(ctx)
        self.followed = followed
        self.stage, self.offload_optimizer, self.offload_params = check_zero_options(
            stage, offload_optimizer, offload_params
        )
        if cpu_adam is not None and not isinstance(cpu_adam, bool):
            raise StrategyError(f"strategy_options.cpu_adam={cpu_adam} must be true or false (or left unset)")
        # DeepSpeedCPUAdam only where it pays: optimizer state on the host, model on a GPU.
        self.cpu_adam = (self.offload_optimizer and ctx.device.type == "cuda") if cpu_adam is None else cpu_adam
        if self.cpu_adam and not self.offload_optimizer:
            raise StrategyError(
                "strategy_options.cpu_adam=true needs the optimizer offloaded: use strategy=zero2-offload "
                "or zero3-offload"
            )
        self.run_config = run_config(
            ctx,
            stage=self.stage,
            offload_optimizer=self.offload_optimizer,
            offload_params=self.offload_params,
            torch_optimizer_offloaded=self.offload_optimizer and not self.cpu_adam,
        )
        if file is not None:
            self.user_config, source = file_config, file.label
        else:
            source = getattr(ctx.config, "deepspeed_config", None)
            self.user_config = read_user_config(source) if source else {}
        check_user_config(self.user_config, self.run_config, source or "")
        self.config: dict[str, Any] = {}
        self.engine: Any = None  # deepspeed.DeepSpeedEngine after setup
        self._micro_step = 0
        # ZeRO-1/2 and ZeRO-3 lay their optimizer partitions out differently: only the same
        # stage loads natively (offloaded or not); any other resume carries the weights over.
        self.checkpoint_format = f"deepspeed-zero{self.stage}"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return missing_package_reason("deepspeed", "pip install deepspeed")

    @classmethod
    def takes_deepspeed_config(cls, config_file: ConfigFile | None) -> bool:
        # `deepspeed:<file.json>` is the whole config already: another merged over it is refused (deepspeed_file.py).
        return config_file is None

    @classmethod
    def resolve_config_file(cls, path: Path) -> FileChoice:
        return deepspeed_file.choose(path, f"{cls.config_file_kind}:{path}")

    def check_model(self, model: nn.Module) -> None:
        super().check_model(model)
        self._fill_model_sized(model)

    def _fill_model_sized(self, model: nn.Module) -> None:
        """A file's "auto" bucket sizes, from the model's width (once: then nothing is "auto")."""
        if self.ctx.config_file is not None:
            self.user_config, self.followed = deepspeed_file.fill_model_sized(
                self.user_config, self.followed, model_size(model), self.ctx.config_file.label
            )

    def compile(self, model: nn.Module) -> str:
        # ZeRO-3 fetches and releases each module's partitioned parameters in hooks around
        # it: those hooks must stay outside the graphs. ZeRO-1/2 only hook the gradients.
        return compile_blocks(model, self.find_blocks(model)) if self.stage == 3 else super().compile(model)

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        deepspeed = import_deepspeed(self.ctx)
        if not self.offload_params:
            model = model.to(self.ctx.device)
        optimizer = optimizer_factory(model)
        if self.cpu_adam:
            optimizer = _as_cpu_adam(optimizer)
        self._fill_model_sized(model)
        self.config = final_config(
            sizing_config(model_size(model), self.stage, self.ctx.world_size), self.run_config, self.user_config
        )
        if self.scheduler is not None:
            self.config["scheduler"] = self.scheduler
        write_config(self.config, self.ctx)
        self.say_followed()
        if self.stage == 3:  # found before DeepSpeed empties the parameters into its partitions
            self.layout = zero3_layout(self.find_blocks(model))
        # The runner's process group already exists: DeepSpeed wraps it, never makes its own. Its
        # notices (the CPU communication op it builds) print on stdout, which carries the run's own
        # lines: to stderr, with the rest of what the libraries say.
        with contextlib.redirect_stdout(sys.stderr):
            engine, _, _, _ = deepspeed.initialize(
                model=model, optimizer=optimizer, config=self.config, dist_init_required=False
            )
        if engine.dp_world_size != self.ctx.world_size:
            raise StrategyError(
                f"DeepSpeed sees {engine.dp_world_size} data-parallel ranks but the run has {self.ctx.world_size}"
            )
        self.engine = self.model = engine
        self.optimizer = engine.optimizer
        return engine, engine.optimizer

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # scales by 1/gradient_accumulation_steps itself
        self._micro_step += 1
        if self._micro_step < self.ctx.grad_accum:
            # Below the boundary engine.step() only counts the micro-step, keeping
            # DeepSpeed's boundary on the runner's last micro-step.
            self.engine.step()

    def step(self) -> None:
        if not self.engine.is_gradient_accumulation_boundary():
            raise StrategyError(
                f"DeepSpeed's micro-step counter is off the accumulation boundary after {self._micro_step} micro-steps"
            )
        self.engine.step()  # reduce, clip, optimizer step, zero the gradients; a scheduler's step
        self._micro_step = 0
        keep_scheduler_in_step(self.engine)

    def set_lr(self, lr: float) -> None:
        groups = self.engine.basic_optimizer.param_groups  # the optimizer DeepSpeed steps
        if self.scheduler is None:
            for group in groups:  # (ZeRO-3's own set_lr is a no-op)
                group["lr"] = lr
            return
        label = self.ctx.config_file.label if self.ctx.config_file else "the DeepSpeed config"
        check_scheduled_lr(self.engine, lr, f"{label}'s scheduler {self.scheduler['type']}")

    def memory_breakdown(self) -> MemoryBreakdown:
        assert self.engine is not None, "setup() first"
        return zero_memory_breakdown(self.engine)

    def save(self, path: Path) -> None:
        assert self.engine is not None, "setup() first"
        save_zero_checkpoint(self.engine, path, CHECKPOINT_TAG)

    def load(self, path: Path) -> None:
        assert self.engine is not None, "setup() first"
        # A scheduler's step is in the checkpoint, which DeepSpeed writes whenever it runs one.
        load_zero_checkpoint(self.engine, path, CHECKPOINT_TAG, with_scheduler=self.scheduler is not None)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        assert self.engine is not None, "setup() first"
        return zero_full_state_dict(self.engine, self.ctx.rank)

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        assert self.engine is not None, "setup() first"
        if self.scheduler is not None and self.ctx.config_file is not None:
            raise StrategyError(
                f"{self.ctx.config_file.label} runs DeepSpeed's scheduler, whose step only its own checkpoint holds: "
                "resume from a checkpoint of this strategy, or remove the file's scheduler section"
            )
        load_zero_full_state_dict(self.engine, state)

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        return read_zero_checkpoint(path, CHECKPOINT_TAG)

    def teardown(self) -> None:
        if self.engine is not None and hasattr(self.engine, "destroy"):
            self.engine.destroy()
        self.engine = None
        super().teardown()


def check_scheduled_lr(engine: Any, lr: float, scheduler: str) -> None:
    """The lr DeepSpeed's own scheduler (`scheduler`, in words) set for this step must be the
    runner's, `lr`: every strategy of the comparison trains under the same schedule."""
    groups = engine.basic_optimizer.param_groups  # the optimizer DeepSpeed steps
    applied = next((group["lr"] for group in groups if not math.isclose(group["lr"], lr, rel_tol=1e-9)), None)
    if applied is not None:
        raise StrategyError(
            f"{scheduler} set lr {applied:.6e} for this step but the run's schedule has {lr:.6e}: remove the "
            "scheduler section to train under the runner's schedule"
        )


def keep_scheduler_in_step(engine: Any) -> None:
    """After the engine's optimizer step: on an fp16 overflow DeepSpeed skips the step and holds its
    scheduler, while the runner's schedule (and every other strategy's, whose scaler skips the step
    too) moves on to the next step's lr; so does the scheduler, here."""
    if engine.lr_scheduler is not None and not engine.was_step_applied():
        engine.lr_scheduler.step()


def zero3_layout(blocks: Blocks) -> str:
    """What ZeRO-3 does per module, for the run's report: DeepSpeed's hooks gather each
    module's own parameters and prefetch by the order they recorded, whatever the blocks;
    the blocks are what compile and checkpointing work through."""
    return (
        f"zero3: parameters gathered module by module in DeepSpeed's hooks, prefetched in its recorded order; "
        f"blocks for compile and checkpointing: {blocks.describe()}"
    )


def write_config(config: dict[str, Any], ctx: RunContext) -> None:
    """The exact config handed to deepspeed.initialize, next to the run's metrics (rank 0), to
    reproduce or inspect it; bench/deepspeed_parity.py compares it with the hand-written loop's."""
    if ctx.rank != 0 or ctx.config is None:
        return
    out_dir = Path(ctx.config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")


def import_deepspeed(ctx: RunContext) -> Any:
    """deepspeed, with its accelerator matching the run's device (DS_ACCELERATOR) and precision."""
    device = ctx.device.type
    os.environ.setdefault("DS_ACCELERATOR", device)
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != device:
        raise StrategyError(
            f"DeepSpeed's accelerator is {accelerator.device_name()!r} but the run trains on {device}: "
            f"unset DS_ACCELERATOR or set DS_ACCELERATOR={device}"
        )
    if ctx.precision == "fp16" and not accelerator.is_fp16_supported():
        raise StrategyError(f"DeepSpeed cannot train in fp16 on this {device}: use precision=bf16 or precision=fp32")
    # DeepSpeed logs every setting at INFO on every rank; the runner reports the run.
    deepspeed.utils.logger.setLevel(logging.WARNING)
    for handler in deepspeed.utils.logger.handlers:  # its own, on stdout: the run's own lines go there
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)
    if device == "cpu":
        from strategies.deepspeed_cpu_op import skip_cpu_comm_op

        skip_cpu_comm_op()
    return deepspeed


def _as_cpu_adam(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The runner's AdamW, same groups and hyper-parameters, as DeepSpeedCPUAdam."""
    import torch

    if not isinstance(optimizer, torch.optim.AdamW):
        raise StrategyError(
            f"strategy_options.cpu_adam=true replaces AdamW, but the run's optimizer is {type(optimizer).__name__}: "
            "set strategy_options.cpu_adam=false"
        )
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    d = optimizer.defaults
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"], "lr": g["lr"]} for g in optimizer.param_groups]
    return DeepSpeedCPUAdam(
        groups,
        lr=d["lr"],
        betas=d["betas"],
        eps=d["eps"],
        weight_decay=d["weight_decay"],
        adamw_mode=True,
        bias_correction=True,
    )


def save_zero_checkpoint(engine: Any, path: Path, tag: str) -> None:
    """Collective: DeepSpeed's checkpoint of `engine` in `path`/`tag` (plus DeepSpeed's 'latest'
    file and its zero_to_fp32.py script, so that DeepSpeed's own tools read it as well)."""
    engine.save_checkpoint(str(path), tag=tag)


def load_zero_checkpoint(engine: Any, path: Path, tag: str, *, with_scheduler: bool) -> None:
    """Collective: model, fp32 master weights and optimizer partitions (and with_scheduler, the
    scheduler's step) back from `path`/`tag`."""
    loaded, _ = engine.load_checkpoint(
        str(path), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=with_scheduler
    )
    if loaded is None:  # DeepSpeed only logs a warning when it finds nothing to load
        raise StrategyError(f"DeepSpeed found no checkpoint in {path / tag}: resume from another checkpoint")


def zero_full_state_dict(engine: Any, rank: int) -> dict[str, torch.Tensor]:
    """Collective: the fp32 master weights (not the module's low-precision copy) under the bare
    model's names on rank 0, gathered one parameter at a time; {} on the other ranks."""
    from deepspeed.utils import safe_get_full_fp32_param

    module = engine.module
    # Every rank gathers every parameter in the same order: each call is a collective.
    master = {id(p): safe_get_full_fp32_param(p).detach().cpu() for p in module.parameters()}
    if rank != 0:
        return {}
    # state_dict(keep_vars=True) names tied parameters twice (wte and lm_head), as the bare model does.
    return {
        name: master[id(t)] if id(t) in master else t.detach().cpu().clone()
        for name, t in module.state_dict(keep_vars=True).items()
    }


def load_zero_full_state_dict(engine: Any, state: dict[str, torch.Tensor]) -> None:
    """Collective: consolidated weights into both the module's parameters and DeepSpeed's fp32
    master partitions (which the optimizer steps from, and would otherwise copy back over
    the module's at the next step). Every rank passes the whole dict."""
    module = engine.module
    expected = set(module.state_dict().keys())
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise StrategyError(
            f"the weights do not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}): "
            "resume from a checkpoint of the same model"
        )
    import deepspeed
    import torch
    from deepspeed.utils import safe_set_full_fp32_param

    params = dict(module.named_parameters())  # a tied parameter once, under its first name
    # ZeRO-3: gathered whole, then re-partitioned from rank 0's values (every rank writes the
    # same); a no-op for ZeRO-1/2, whose ranks hold every parameter whole.
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0):
        for name, p in params.items():
            p.data.copy_(state[name].to(p.device, p.dtype))
    for name, p in params.items():
        safe_set_full_fp32_param(p, state[name].to(p.device, torch.float32))
    for name, buffer in module.named_buffers():
        if name in state:
            buffer.data.copy_(state[name].to(buffer.device, buffer.dtype))


def read_zero_checkpoint(path: Path, tag: str) -> dict[str, torch.Tensor]:
    """Offline: the fp32 master weights of the DeepSpeed checkpoint `path`/`tag` under the bare
    model's names (tied weights under each of theirs)."""
    if not (path / tag).is_dir():
        raise StrategyError(f"{path} holds no DeepSpeed checkpoint {tag!r}: give a checkpoint a ZeRO strategy wrote")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # It reports its progress (prints, and tqdm bars on stderr) into the middle of a run's log or
    # an export's output, which say what was read themselves; failures still raise.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # Tied names come back from the checkpoint's shared_params, as one tensor under both.
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(path), tag=tag))


def zero_memory_breakdown(engine: Any) -> MemoryBreakdown:
    """What this rank holds under a DeepSpeed engine, measured from DeepSpeed's tensors.

    params: the model's parameters as DeepSpeed stores them (ZeRO-1/2: the whole flat
    model; ZeRO-3: this rank's ds_tensor partitions plus any parameter kept whole, and under
    ZeRO++ hpZ its secondary partitions).
    optimizer: the fp32 master partitions and the optimizer's moments; the master copy
    counts as optimizer state, as the ZeRO paper's K=12 bytes per parameter does.
    grads: this rank's gradient partitions and the buffers DeepSpeed reduces them in.
    Each storage counts once (most of these tensors are views into a few flat
    buffers), under the first category that claims it: under ZeRO-3 in fp32 the master
    partition is the parameter partition itself, and counts as parameters.
    """
    zero = engine.optimizer
    module_params = list(engine.module.parameters())
    master = list(_tensors_in(getattr(zero, name, None) for name in MASTER_BUFFERS))
    tally = _StorageTally()
    params = tally.count(
        [p.data for p in module_params],
        [getattr(p, "ds_tensor", None) for p in module_params],
        # ZeRO++ hpZ: the secondary copy of the parameter shards within each group.
        [getattr(p, "ds_secondary_tensor", None) for p in module_params],
        _tensors_in(getattr(zero, name, None) for name in PARAM_BUFFERS),
    )
    optimizer = tally.count(master, _tensors_in(engine.basic_optimizer.state.values()))
    grads = tally.count(
        [p.grad for p in module_params],
        [p.grad for p in master],
        _tensors_in(getattr(zero, name, None) for name in GRAD_BUFFERS),
    )
    return MemoryBreakdown(params=params, grads=grads, optimizer=optimizer)


class _StorageTally:
    """Bytes per device type, each underlying storage counted once across all calls."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int | None, int]] = set()

    def count(self, *groups: Iterable[torch.Tensor | None]) -> dict[str, int]:
        out: dict[str, int] = {}
        for tensors in groups:
            for t in tensors:
                if t is None or t.device.type == "meta":
                    continue
                storage = t.untyped_storage()
                key = (t.device.type, t.device.index, storage.data_ptr())
                if storage.nbytes() == 0 or key in self._seen:
                    continue
                self._seen.add(key)
                out[t.device.type] = out.get(t.device.type, 0) + storage.nbytes()
        return out


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested dicts, other iterables and reduction buckets (their .buffer)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_in(value)
    elif hasattr(obj, "buffer"):
        yield from _tensors_in(obj.buffer)
    elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        for value in obj:
            yield from _tensors_in(value)
