"""`accelerate-zero1/2/3`: Accelerate driving DeepSpeed ZeRO, with the same config layers as
the native zero1-3 (strategies/deepspeed_config.py).

A DeepSpeed JSON that an `accelerate:<file.yaml>` names (deepspeed_config_file) runs as Accelerate
runs it for Hugging Face's Trainer: its "auto" values filled from the run (strategies/deepspeed_file.py,
as under deepspeed:<file.json>), its AdamW section the runner's AdamW, and its scheduler section handed
to prepare() as accelerate.utils.DummyScheduler, so that DeepSpeed's own scheduler steps the learning
rate; each step checks it is the runner's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from strategies import deepspeed_file
from strategies.accelerate.accelerate_file import DEEPSPEED_FILE_KEY
from strategies.accelerate.driver import AccelerateStrategy
from strategies.accelerate.environment import launched_by_accelerate
from strategies.base import Preset, RunContext, StrategyError, compile_blocks, missing_package_reason
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.blocks import Blocks
    from strategies.config_files import ConfigFile
    from strategies.memory import MemoryBreakdown

# The loop measures memory between backward and step of its second step (harness/train/loop.py).
MEASURED_STEPS = 2
_SHARDED = {
    1: "optimizer state sharded",
    2: "optimizer state and gradients sharded",
    3: "parameters, gradients, optimizer state sharded",
}


def _zero(stage: int) -> Preset:
    return Preset(
        f"accelerate-zero{stage}",
        f"Accelerate driving DeepSpeed ZeRO-{stage} ({_SHARDED[stage]})",
        {"stage": stage},
        PlanModel("deepspeed", stage, "low_precision", via_accelerate=True),
    )


class AccelerateDeepSpeedStrategy(AccelerateStrategy):
    description = "Accelerate driving DeepSpeed ZeRO"
    presets = (_zero(1), _zero(2), _zero(3))
    distributed_type = "DEEPSPEED"
    # Accelerate's DeepSpeed plugin imports transformers' HfDeepSpeedConfig in every prepare (3 s a rank).
    backend_modules = ("accelerate", "deepspeed", "transformers.integrations.deepspeed")
    # DeepSpeed's partitions load only at the world size that wrote them, as under zero1-3.
    checkpoint_reshards = False

    # Each name presets `stage`, so the registry refuses it as a strategy_options key:
    # accelerate-zero1 cannot quietly become ZeRO-3.
    def __init__(self, ctx: RunContext, *, stage: int = 2):
        self.stage = stage
        super().__init__(ctx)
        self._held_before_step: MemoryBreakdown | None = None
        # The scheduler section of the file's DeepSpeed JSON, filled and checked to be the run's schedule.
        self.scheduler: dict[str, Any] | None = (self._file_deepspeed_json or {}).get("scheduler")
        # How messages name the JSON, where its scheduler runs.
        self._scheduler_source = self.file.json_label(self.file.deepspeed_json()) if self.scheduler else ""

    @property
    def mode(self) -> str:
        return f"zero{self.stage}"

    @classmethod
    def takes_deepspeed_config(cls, config_file: ConfigFile | None) -> bool:
        # Merged over the plugin's config as zero1-3 merge it; an Accelerate file naming a DeepSpeed JSON of its
        # own (deepspeed_config_file) has its whole config already, and another merged over it is refused.
        return config_file is None or DEEPSPEED_FILE_KEY not in config_file.choice.files

    @classmethod
    def unavailable_reason(cls) -> str | None:
        # DeepSpeedPlugin.select() imports transformers' HfDeepSpeedConfig, whatever the model.
        return (
            super().unavailable_reason()
            or missing_package_reason("deepspeed", "pip install deepspeed")
            or missing_package_reason(
                "transformers", "Accelerate's DeepSpeed plugin needs it: pip install transformers"
            )
        )

    @classmethod
    def recovers_from_oom(cls, options: dict[str, Any]) -> bool:
        # As zero1-3: ZeRO-3 keeps the model in a module-level stack of its hooks.
        return options.get("stage") in (1, 2)

    def compile(self, model: nn.Module) -> str:
        # ZeRO-3 hooks each block (gather and release its parameters): per block, as under zero3.
        return compile_blocks(model, self.find_blocks(model)) if self.stage == 3 else super().compile(model)

    def _plugins(self, model: nn.Module) -> dict[str, Any]:
        from accelerate.utils import DeepSpeedPlugin

        from strategies.deepspeed_config import model_size, sizing_config

        if self.ctx.device.type == "cpu":  # DeepSpeed comes up with the Accelerator
            from strategies.deepspeed_cpu_op import skip_cpu_comm_op

            skip_cpu_comm_op()
        if launched_by_accelerate(os.environ):
            plugin = DeepSpeedPlugin()  # stage, offload, config file: from the launcher's environment
        else:
            plugin = DeepSpeedPlugin(
                zero_stage=self.stage,
                gradient_accumulation_steps=self.ctx.grad_accum,
                gradient_clipping=self.ctx.grad_clip,
                offload_optimizer_device="none",
                offload_param_device="none",
                zero3_init_flag=False,  # the model is built before the engine, the same for every strategy
            )
        config = plugin.deepspeed_config
        if self.file is not None:
            # An optimizer section of the file's DeepSpeed JSON is there only if it is the run's AdamW
            # (accelerate_file.py checked it): the runner's AdamW is that optimizer.
            config.pop("optimizer", None)
            self._fill_from_json(config, model)
        for key in ("optimizer", "scheduler"):
            if key in config and not (key == "scheduler" and self.scheduler is not None):
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
                    f'micro_batch, grad_clip and the world size): set it to "auto" in the DeepSpeed config'
                )
        # The same sizing as the zero1-3 strategies (DeepSpeed's defaults, the reduction bucket cut
        # to the model's size); Accelerate's own "auto" rule would shrink the buckets to hidden x
        # hidden for a transformers model. Values the user's config sets stay.
        zero_config = config.setdefault("zero_optimization", {})
        sizing = sizing_config(model_size(model), plugin.zero_stage, self.ctx.world_size).get("zero_optimization", {})
        for key, value in sizing.items():
            if zero_config.get(key, "auto") == "auto":
                zero_config[key] = value
        # Any other "auto" of a DeepSpeed JSON (the ZeRO-3 prefetch bucket): DeepSpeed's own default, as
        # under zero1-3; Accelerate would size it from a transformers model's hidden size.
        for key in [key for key, value in zero_config.items() if value == "auto"]:
            del zero_config[key]
        return {"deepspeed_plugin": plugin}

    def _fill_from_json(self, config: dict[str, Any], model: nn.Module) -> None:
        """Accelerate's reading of the file's DeepSpeed JSON (`config`, in place) with the "auto" values
        parabench filled and said: the scheduler's from the run, the bucket sizes from the model's width,
        as Hugging Face's Trainer fills them before Accelerate sees the JSON."""
        from strategies.deepspeed_config import HF_BUCKET_SIZES, model_size

        if self._file_deepspeed_json is None:
            return
        label = self.file.json_label(self.file.deepspeed_json())
        filled, self.followed = deepspeed_file.fill_model_sized(
            self._file_deepspeed_json, self.followed, model_size(model), label
        )
        if self.scheduler is not None:
            config["scheduler"] = self.scheduler
        zero = config.get("zero_optimization", {})
        for key in HF_BUCKET_SIZES:
            if zero.get(key) == "auto":
                zero[key] = filled["zero_optimization"][key]

    def _schedulers(self, optimizer: torch.optim.Optimizer) -> list[Any]:
        if self.scheduler is None:
            return []
        from accelerate.utils import DummyScheduler

        # As Accelerate's users hand it a JSON's scheduler: DeepSpeed builds it from the section, whose
        # values are filled already (Accelerate's own fill, warmup_min_lr 0 among it, has nothing to fill).
        return [DummyScheduler(optimizer)]

    def _merge_user_deepspeed_config(self, config: dict[str, Any], stage: int) -> None:
        """`deepspeed_config=<file.json>` merged, in place, over the plugin's config, by the rules of
        zero1-3: refused where it contradicts the run, "auto" values left to parabench."""
        from strategies.deepspeed_config import check_user_config, merge, normalized, read_user_config, run_config

        source = getattr(self.ctx.config, "deepspeed_config", None)
        if not source:
            return
        user = read_user_config(source)
        check_user_config(
            user,
            run_config(
                self.ctx, stage=stage, offload_optimizer=False, offload_params=False, torch_optimizer_offloaded=False
            ),
            source,
        )
        # In place: Accelerate's plugin keeps this very dict.
        config.update(merge(config, normalized(user)))

    def _after_prepare(self) -> None:
        from strategies.deepspeed import write_config

        # What Accelerate handed deepspeed.initialize (the engine keeps that dict), in the same
        # file as under zero1-3.
        write_config(self.model.config, self.ctx)
        self._measure_before_engine_steps(self.model)

    def _measure_before_engine_steps(self, engine: Any) -> None:
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

    def _mode_detail(self) -> str:
        return f"{super()._mode_detail()}, ZeRO stage {self.accelerator.state.deepspeed_plugin.zero_stage}"

    def _layout(self, blocks: Blocks) -> str | None:
        from strategies.deepspeed import zero3_layout

        return zero3_layout(blocks) if self.stage == 3 else None

    def clip_gradients(self) -> None:
        """DeepSpeed clips inside its own step, from gradient_clipping in its config."""

    def step(self) -> None:
        from strategies.deepspeed import keep_scheduler_in_step

        super().step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()  # as Accelerate's users step it: a no-op, DeepSpeed's engine stepped it
            keep_scheduler_in_step(self.model)

    def set_lr(self, lr: float) -> None:
        from strategies.deepspeed import check_scheduled_lr

        if self.scheduler is None:
            super().set_lr(lr)
            return
        # The JSON's scheduler set this step's lr itself: it must be the runner's.
        check_scheduled_lr(self.model, lr, f"{self._scheduler_source}'s scheduler {self.scheduler['type']}")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from strategies.deepspeed import zero_full_state_dict

        assert self.model is not None, "setup() first"
        return zero_full_state_dict(self.model, self.ctx.rank)

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from strategies.deepspeed import load_zero_full_state_dict

        assert self.model is not None, "setup() first"
        if self.scheduler is not None:
            raise StrategyError(
                f"{self._scheduler_source} runs DeepSpeed's scheduler, whose step only its own checkpoint holds: "
                "resume from a checkpoint of this strategy, or remove the JSON's scheduler section"
            )
        load_zero_full_state_dict(self.model, state)

    def memory_breakdown(self) -> MemoryBreakdown:
        from strategies.deepspeed import zero_memory_breakdown

        return self._held_before_step or zero_memory_breakdown(self.model)
