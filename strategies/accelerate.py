"""`accelerate-ddp`, `accelerate-fsdp`, `accelerate-zero1/2/3`: the same backends as
`ddp`, `fsdp` and `zero1-3`, driven through Hugging Face Accelerate.

Accelerate is configured in code (an `Accelerator` with an FSDP2 or DeepSpeed plugin,
mixed precision from the run's precision, accumulation from its micro-batching).
Under `accelerate launch` it takes Accelerate's own settings from the ACCELERATE_*
environment the launcher sets, and refuses, in one line, settings that contradict
the chosen strategy name or the run. Either way it reuses the process group the
runner created; Accelerate's state is checked to agree with it.

On CPU, Accelerate 1.15 has no distributed type for FSDP or DeepSpeed (it only knows
MULTI_CPU = DDP over gloo), and without `cpu=True` it counts a world of one. Two
small, checked nudges make every mode run over gloo: Accelerate is told the process
group's backend (then it counts the ranks right, and its DeepSpeed path works on
CPU), and for FSDP the distributed type it gates on the device type is set to FSDP.

Checkpoints are Accelerate's own `save_state`/`load_state` directories, one format per
mode: under ddp the wrapped model's state dict and the optimizer's (rank 0), under
fsdp what Accelerate's FSDP2 plugin writes (a full state dict by default, DCP shards
with fsdp_state_dict_type: SHARDED_STATE_DICT), under zero1-3 DeepSpeed's checkpoint
(engine.save_checkpoint, tag "pytorch_model"), which, as for `zero1-3`, only the same
world size loads. Accelerate's per-rank RNG files ride along; the checkpoint manager
restores every generator after them.
"""
from __future__ import annotations

import contextlib
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, ContextManager, Iterator, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from models.blocks import Blocks
from strategies.base import OptimizerFactory, RunContext, Strategy, StrategyError, compile_blocks, missing_package_reason
from strategies.memory import MemoryBreakdown

# What Accelerate's save_state writes (accelerate.utils.constants), by mode: the offline
# reader tells the modes apart by these names alone.
DEEPSPEED_TAG = "pytorch_model"  # save_state's ckpt_id for the first (only) DeepSpeed model
DDP_WEIGHTS = "pytorch_model.bin"
FSDP_FULL_WEIGHTS = "pytorch_model_fsdp.bin"
FSDP_SHARDED_WEIGHTS = "pytorch_model_fsdp_0"

MODES = {
    "ddp": "Accelerate driving DistributedDataParallel",
    "fsdp": "Accelerate driving FSDP2 (fully_shard per block)",
    "zero1": "Accelerate driving DeepSpeed ZeRO-1 (optimizer state sharded)",
    "zero2": "Accelerate driving DeepSpeed ZeRO-2 (optimizer state and gradients sharded)",
    "zero3": "Accelerate driving DeepSpeed ZeRO-3 (parameters, gradients, optimizer state sharded)",
}
ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
# The loop measures memory between backward and step of its second step (harness/train.py).
MEASURED_STEPS = 2
# Environment variables Accelerator() writes into os.environ; restored at teardown.
_ENV_WRITTEN_BY_ACCELERATE = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


def launched_by_accelerate(env: Mapping[str, str]) -> bool:
    """Every `accelerate launch` launcher (simple, multi-GPU, DeepSpeed) sets this one."""
    return "ACCELERATE_MIXED_PRECISION" in env


def _deepspeed_stage(env: Mapping[str, str]) -> str:
    if env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        return env["ACCELERATE_DEEPSPEED_ZERO_STAGE"]
    config_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if config_file != "none":
        try:
            stage = json.loads(Path(config_file).read_text()).get("zero_optimization", {}).get("stage")
        except (OSError, ValueError) as exc:
            raise StrategyError(
                f"cannot read the DeepSpeed config file {config_file!r} that accelerate launch names: {exc}"
            ) from None
        if stage is not None:
            return str(stage)
    return "2"  # DeepSpeedPlugin's default stage


def launcher_mode(env: Mapping[str, str]) -> str | None:
    """The mode an `accelerate launch` config or flags chose, or None when not launched by it."""
    if not launched_by_accelerate(env):
        return None
    if _flag(env, "ACCELERATE_USE_MEGATRON_LM"):
        return "megatron-lm"
    if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        return f"zero{_deepspeed_stage(env)}"
    if _flag(env, "ACCELERATE_USE_FSDP"):
        return "fsdp"
    return "ddp"


def check_launcher_settings(env: Mapping[str, str], mode: str, ctx: RunContext) -> None:
    """Refuse, in one line, `accelerate launch` settings that contradict the strategy or the run."""
    launched = launcher_mode(env)
    if launched is None:
        return
    if launched != mode:
        fix = f"strategy=accelerate-{launched}" if launched in MODES else "a config from configs/accelerate/"
        raise StrategyError(
            f"accelerate launch is set up for {launched} (its config file or flags) but the strategy is "
            f"accelerate-{mode}: use {fix}, or launch with --config_file configs/accelerate/{mode}.yaml"
        )
    if _flag(env, "ACCELERATE_USE_CPU") and (mode != "ddp" or ctx.device.type != "cpu"):
        raise StrategyError(
            f"accelerate launch --cpu (use_cpu: true) makes Accelerate ignore FSDP, DeepSpeed and GPUs, and starts one "
            f"process: drop --cpu and launch with --config_file configs/accelerate/{mode}.yaml (parabench uses gloo on CPU)"
        )
    launched_precision = env["ACCELERATE_MIXED_PRECISION"].strip().lower()
    if launched_precision != ACCELERATE_PRECISION[ctx.precision]:
        wanted = {v: k for k, v in ACCELERATE_PRECISION.items()}.get(launched_precision, launched_precision)
        raise StrategyError(
            f"accelerate launch set mixed_precision={launched_precision} but the run has precision={ctx.precision}: "
            f"add precision={wanted}, or launch with --mixed_precision {ACCELERATE_PRECISION[ctx.precision]}"
        )
    launched_accum = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip()
    if launched_accum.isdigit() and int(launched_accum) != ctx.grad_accum:
        raise StrategyError(
            f"accelerate launch set gradient_accumulation_steps={launched_accum} but this run accumulates "
            f"{ctx.grad_accum} micro-steps: add grad_accum={launched_accum}, or drop it from the accelerate config"
        )
    if mode == "fsdp" and env.get("FSDP_VERSION", "1").strip() != "2":
        raise StrategyError(
            "accelerate-fsdp runs FSDP2 but the accelerate config asks for FSDP1: set fsdp_version: 2 in its "
            "fsdp_config (as configs/accelerate/fsdp.yaml does)"
        )


class AccelerateStrategy(Strategy):
    description = "Hugging Face Accelerate"
    checkpoint_format = "accelerate"  # the family; each instance narrows it to its mode

    @classmethod
    def recovers_from_oom(cls, options: dict) -> bool:
        # Teardown frees the Accelerator and resets its process-wide state; under DeepSpeed, as zero1-3 do.
        return options.get("mode") in ("ddp", "fsdp", "zero1", "zero2")

    # Each name presets `mode`, so the registry refuses it as a strategy_options key, as it
    # does every option a name presets: accelerate-ddp cannot quietly become ZeRO-3.
    def __init__(self, ctx: RunContext, *, mode: str = "ddp"):
        super().__init__(ctx)
        if mode not in MODES:
            raise StrategyError(f"accelerate mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        check_launcher_settings(os.environ, mode, ctx)
        # Each mode writes its own layout; the ZeRO modes' DeepSpeed partitions load only at the
        # world size that wrote them, as under `zero1-3`.
        self.checkpoint_format = f"accelerate-{mode}"
        self.checkpoint_reshards = not mode.startswith("zero")
        self.accelerator = None
        self._env_before: dict[str, str | None] = {}
        self._held_before_step: MemoryBreakdown | None = None
        self._unwrapped_because: str | None = None  # why accelerate-fsdp left the blocks unwrapped

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return missing_package_reason("accelerate", "pip install accelerate")

    # ---- setup -------------------------------------------------------------------------

    def compile(self, model: nn.Module) -> str:
        # FSDP and ZeRO-3 hook each block (gather and release its parameters): per block, as
        # under the native fsdp and zero3; DDP and ZeRO-1/2 take the whole model.
        return compile_blocks(model, self.find_blocks(model)) if self.mode in ("fsdp", "zero3") else super().compile(model)

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        runner_group = dist.group.WORLD
        self.accelerator = self._build_accelerator(model)
        if dist.group.WORLD is not runner_group:
            raise StrategyError("Accelerate replaced the runner's process group: launch with torchrun or accelerate launch")
        self._check_state_matches_runner()
        if self.ctx.rank == 0:
            print(self._mode_line(), flush=True)
        # On the device before the optimizer exists, so that it is built there (fused AdamW on CUDA).
        model = model.to(self.ctx.device)
        optimizer = optimizer_factory(model)
        blocks = self.find_blocks(model)  # before ZeRO-3 empties the parameters into its partitions
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        if self.mode.startswith("zero"):
            from strategies.deepspeed import write_config

            # What Accelerate handed deepspeed.initialize (the engine keeps that dict), in the
            # same file as under zero1-3.
            write_config(self.model.config, self.ctx)
            self._measure_before_engine_steps(self.model)
        self.layout = self._layout(blocks)
        return self.model, self.optimizer

    def _layout(self, blocks: Blocks) -> str | None:
        if self.mode == "fsdp":
            from strategies.fsdp import fsdp_units

            units = fsdp_units(self.model, blocks)
            return f"fsdp: {units}; {self._unwrapped_because}" if self._unwrapped_because else f"fsdp: {units}"
        if self.mode == "zero3":
            from strategies.deepspeed import zero3_layout

            return zero3_layout(blocks)
        return None

    def _measure_before_engine_steps(self, engine) -> None:
        """Accelerate's DeepSpeed backward() runs the engine's step at the accumulation
        boundary, so when the loop asks (between backward and step) the gradient partitions
        are already released. Measure just before the engine steps: the point every other
        strategy is measured at. Only the first MEASURED_STEPS boundaries are measured (the
        loop reads the second step's, once the optimizer state exists); then the engine's own
        step is put back, so that the hot loop runs exactly what Accelerate runs."""
        from strategies.deepspeed import zero_memory_breakdown

        engine_step = engine.step
        measured = 0

        def step_after_measuring(*args: Any, **kwargs: Any) -> Any:
            nonlocal measured
            if engine.is_gradient_accumulation_boundary():
                self._held_before_step = zero_memory_breakdown(engine)
                measured += 1
                if measured == MEASURED_STEPS:
                    engine.step = engine_step
            return engine_step(*args, **kwargs)

        engine.step = step_after_measuring

    def _build_accelerator(self, model: nn.Module):
        from accelerate import Accelerator
        from accelerate.utils import AutocastKwargs, DistributedDataParallelKwargs, InitProcessGroupKwargs

        self._env_before = {k: os.environ.get(k) for k in _ENV_WRITTEN_BY_ACCELERATE}
        plugins: dict[str, Any] = {}
        if self.mode == "fsdp":
            plugins["fsdp_plugin"] = self._fsdp_plugin(model)
        elif self.mode.startswith("zero"):
            plugins["deepspeed_plugin"] = self._deepspeed_plugin(model)
        handlers: list[Any] = []
        if self.mode == "ddp":
            # As the native ddp and a hand-written DDP loop: gradients live in the all-reduce buckets,
            # one copy of them, not a second one DDP copies into every step (torch's default).
            handlers.append(DistributedDataParallelKwargs(gradient_as_bucket_view=True))
        if self.mode == "fsdp":
            # FSDP2's MixedPrecisionPolicy casts the parameters, as under the native fsdp and in a
            # hand-written FSDP2 loop; Accelerate would also run the forward under autocast, whose
            # extra casts (layer norms in fp32) neither of those has.
            handlers.append(AutocastKwargs(enabled=False))
        if self.ctx.device.type == "cpu":
            # Told the backend of the group that already exists, Accelerate counts the
            # ranks from it; left to guess on a CPU, it sees a world of one.
            timeout = timedelta(seconds=getattr(self.ctx.config, "pg_timeout_s", 1800))
            handlers.append(InitProcessGroupKwargs(backend=dist.get_backend(), timeout=timeout))
        accelerator = Accelerator(
            mixed_precision=ACCELERATE_PRECISION[self.ctx.precision],
            gradient_accumulation_steps=self.ctx.grad_accum,
            # MULTI_CPU (gloo DDP) is what cpu=True means; it would also drop FSDP and DeepSpeed.
            cpu=self.mode == "ddp" and self.ctx.device.type == "cpu",
            kwargs_handlers=handlers,
            **plugins,
        )
        if self.mode == "fsdp" and self.ctx.device.type == "cpu":
            self._enable_fsdp_on_cpu(accelerator, plugins["fsdp_plugin"])
        return accelerator

    def _fsdp_plugin(self, model: nn.Module):
        from accelerate.utils import FullyShardedDataParallelPlugin

        if launched_by_accelerate(os.environ):
            return FullyShardedDataParallelPlugin()  # every setting from the launcher's FSDP_* environment
        blocks = self.find_blocks(model)
        self._unwrapped_because = _why_not_wrapped_by_class(model, blocks)
        if self._unwrapped_because and self.ctx.rank == 0:
            print(f"warning: accelerate-fsdp: {self._unwrapped_because}, so the blocks are not sharded one by one and "
                  "every parameter is gathered at once for the forward; name the blocks by a class only they have with "
                  "model_blocks=<ClassName>, or use strategy=fsdp, which shards the blocks themselves", flush=True)
        block_classes = [] if self._unwrapped_because else blocks.classes
        from strategies.fsdp import mixed_precision_policy

        return FullyShardedDataParallelPlugin(
            fsdp_version=2,
            # The native fsdp's policy: low-precision compute, gradients reduced in fp32, the loss
            # left in fp32 (Accelerate's own would reduce in bf16 and cast the loss to bf16).
            mixed_precision_policy=mixed_precision_policy(self.ctx),
            reshard_after_forward=True,
            # One FSDP unit per block, then the root: as `fsdp` does.
            auto_wrap_policy="transformer_based_wrap" if block_classes else "no_wrap",
            transformer_cls_names_to_wrap=block_classes or None,
            cpu_ram_efficient_loading=False,  # every rank already holds the same seeded weights
        )

    def _deepspeed_plugin(self, model: nn.Module):
        from accelerate.utils import DeepSpeedPlugin

        from strategies.deepspeed_config import model_size, sizing_config

        if launched_by_accelerate(os.environ):
            plugin = DeepSpeedPlugin()  # stage, offload, config file: from the launcher's environment
        else:
            plugin = DeepSpeedPlugin(
                zero_stage=int(self.mode[-1]),
                gradient_accumulation_steps=self.ctx.grad_accum,
                gradient_clipping=self.ctx.grad_clip,
                offload_optimizer_device="none",
                offload_param_device="none",
                zero3_init_flag=False,  # the model is built before the engine, the same for every strategy
            )
        config = plugin.deepspeed_config
        for key in ("optimizer", "scheduler"):
            if key in config:
                raise StrategyError(
                    f"the DeepSpeed config sets its own {key}: remove it; every parabench strategy shares the runner's "
                    "AdamW and learning-rate schedule"
                )
        self._merge_user_deepspeed_config(config, plugin.zero_stage)
        # With no DataLoader passed to prepare(), Accelerate cannot infer the micro-batch; the runner
        # knows it. Left "auto", Accelerate would also clip at 1.0 whatever grad_clip says.
        expected = {
            "train_micro_batch_size_per_gpu": self.ctx.micro_batch,
            "gradient_accumulation_steps": self.ctx.grad_accum,
            "train_batch_size": self.ctx.micro_batch * self.ctx.grad_accum * self.ctx.world_size,
            "gradient_clipping": self.ctx.grad_clip,  # 0: DeepSpeed does not clip
        }
        for key, value in expected.items():
            configured = config.get(key, "auto" if key != "gradient_clipping" else 0.0)
            if configured == "auto":
                config[key] = value
            elif float(configured) != value:
                raise StrategyError(
                    f"the DeepSpeed config sets {key}={configured} but this run has {value} (from batch_size, "
                    f"micro_batch, grad_clip and the world size): set it to \"auto\" in the DeepSpeed config"
                )
        # The same sizing as the zero1-3 strategies (DeepSpeed's defaults, the reduction bucket cut
        # to the model's size); Accelerate's own "auto" rule would shrink the buckets to hidden x
        # hidden for a transformers model. Values the user's config sets stay.
        zero_config = config.setdefault("zero_optimization", {})
        sizing = sizing_config(model_size(model), plugin.zero_stage, self.ctx.world_size).get("zero_optimization", {})
        for key, value in sizing.items():
            if zero_config.get(key, "auto") == "auto":
                zero_config[key] = value
        return plugin

    def _merge_user_deepspeed_config(self, config: dict[str, Any], stage: int) -> None:
        """`deepspeed_config=<file.json>` merged, in place, over the plugin's config, by the rules of
        zero1-3: refused where it contradicts the run, "auto" values left to parabench."""
        from strategies.deepspeed_config import check_user_config, merge, normalized, read_user_config, run_config

        source = getattr(self.ctx.config, "deepspeed_config", None)
        if not source:
            return
        user = read_user_config(source)
        check_user_config(user, run_config(self.ctx, stage=stage, offload_optimizer=False, offload_params=False,
                                           torch_optimizer_offloaded=False), source)
        # In place: Accelerate's plugin keeps this very dict.
        config.update(merge(config, normalized(user)))

    @staticmethod
    def _enable_fsdp_on_cpu(accelerator, fsdp_plugin) -> None:
        """Accelerate picks FSDP only for accelerator devices; on CPU its FSDP2 path itself
        (fully_shard on a gloo mesh) works, so set the distributed type it gates on."""
        from accelerate.state import AcceleratorState, PartialState
        from accelerate.utils import DistributedType

        mixed_precision = accelerator.state.mixed_precision
        if mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(mixed_precision)
        AcceleratorState._shared_state["fsdp_plugin"] = fsdp_plugin
        AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    def _check_state_matches_runner(self) -> None:
        """Accelerate must see the runner's world, not build its own."""
        from accelerate.utils import DistributedType

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
        wanted = {"ddp": None, "fsdp": DistributedType.FSDP}.get(self.mode, DistributedType.DEEPSPEED)
        if ctx.world_size > 1 and self.mode == "ddp" and not acc.use_distributed:
            raise StrategyError(f"Accelerate chose {acc.distributed_type} for {ctx.world_size} processes, not DDP")
        if wanted is not None and acc.distributed_type != wanted:
            raise StrategyError(
                f"Accelerate chose {acc.distributed_type} although accelerate-{self.mode} asks for {wanted}: "
                "check the accelerate config (accelerate env) against configs/accelerate/"
            )
        if self.mode == "fsdp" and not acc.is_fsdp2:
            raise StrategyError("accelerate-fsdp runs FSDP2: set fsdp_version: 2 in the accelerate config")

    def _mode_line(self) -> str:
        acc = self.accelerator
        source = "accelerate launch config" if launched_by_accelerate(os.environ) else "configured in code"
        detail = str(acc.distributed_type).split(".")[-1]
        if self.mode.startswith("zero"):
            detail += f", ZeRO stage {acc.state.deepspeed_plugin.zero_stage}"
        elif self.mode == "fsdp":
            detail += f" v{acc.state.fsdp_plugin.fsdp_version}"
        return (
            f"accelerate: mode {self.mode} ({source}): {detail}, {acc.num_processes} "
            f"process{'es' if acc.num_processes != 1 else ''}, "
            f"mixed_precision {acc.mixed_precision}, gradient_accumulation_steps {acc.gradient_accumulation_steps}"
        )

    # ---- the loop's verbs -----------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        # Accelerate divides by gradient_accumulation_steps (DeepSpeed's engine does, under DeepSpeed);
        # at a boundary (sync_gradients) its DeepSpeed path also runs the engine's step.
        self.accelerator.backward(loss)

    def step(self) -> None:
        acc = self.accelerator
        if self.ctx.grad_clip > 0 and not self.mode.startswith("zero"):
            # DeepSpeed clips inside its own step, from gradient_clipping in its config.
            acc.clip_grad_norm_(self.model.parameters(), self.ctx.grad_clip)
        self.optimizer.step()  # a no-op under DeepSpeed: the engine stepped in backward()
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
        assert self.model is not None, "setup() first"
        if self.mode.startswith("zero"):
            from strategies.deepspeed import zero_full_state_dict

            return zero_full_state_dict(self.model, self.ctx.rank)
        # Strips DDP's "module." prefix and gathers FSDP2's shards; rank 0 keeps the result.
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.ctx.rank == 0 else {}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        assert self.model is not None, "setup() first"
        if self.mode.startswith("zero"):
            from strategies.deepspeed import load_zero_full_state_dict

            load_zero_full_state_dict(self.model, state)
        else:
            # A copy: under DDP, set_model_state_dict renames the keys of the dict it is given in place.
            set_model_state_dict(self.model, dict(state), options=StateDictOptions(full_state_dict=True, strict=True))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
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
        raise StrategyError(f"{path} holds none of the files Accelerate's save_state writes: give a checkpoint an "
                            "accelerate-* strategy wrote")

    # ---- measurement and teardown -----------------------------------------------------------

    def memory_breakdown(self) -> MemoryBreakdown:
        if self.mode.startswith("zero"):
            from strategies.deepspeed import zero_memory_breakdown

            return self._held_before_step or zero_memory_breakdown(self.model)
        return MemoryBreakdown.of(self.model, _innermost_optimizer(self.optimizer))

    def teardown(self) -> None:
        if self.accelerator is not None:
            from accelerate.state import AcceleratorState, GradientState

            self.accelerator.free_memory()
            # Accelerate's state is a process-wide singleton; the process group stays the runner's.
            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
            for key, value in self._env_before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self.accelerator = None
        super().teardown()


def _why_not_wrapped_by_class(model: nn.Module, blocks: Blocks) -> str | None:
    """Why Accelerate's transformer_based_wrap cannot shard exactly the blocks, or None. It
    wraps every module of the named classes (isinstance: subclasses too), not the blocks
    themselves, and FSDP2 refuses a block whose parameter is tied to one outside it."""
    from strategies.fsdp import tied_outside

    block_ids = {id(b) for b in blocks.modules}
    block_types = tuple({type(b) for b in blocks.modules})
    for name, m in model.named_modules():
        if m is not model and id(m) not in block_ids and (isinstance(m, block_types) or type(m).__name__ in blocks.classes):
            return f"Accelerate wraps by class, and {name} is a {type(m).__name__} outside the blocks"
    tied = tied_outside(model, blocks)
    if tied:
        return f"block {next(iter(tied.values()))} is tied to a parameter outside it"
    return None


def _innermost_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer under Accelerate's (and DeepSpeed's) wrappers, which holds the state."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


class AccelerateDeepSpeedStrategy(AccelerateStrategy):
    """The ZeRO modes also need DeepSpeed itself, and transformers for Accelerate's plugin."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        # DeepSpeedPlugin.select() imports transformers' HfDeepSpeedConfig, whatever the model.
        return (super().unavailable_reason()
                or missing_package_reason("deepspeed", "pip install deepspeed")
                or missing_package_reason("transformers", "Accelerate's DeepSpeed plugin needs it: pip install transformers"))


def register_strategies(registry) -> None:
    for mode, description in MODES.items():
        cls = AccelerateDeepSpeedStrategy if mode.startswith("zero") else AccelerateStrategy
        registry.register(f"accelerate-{mode}", cls, description, mode=mode)
