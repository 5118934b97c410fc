"""`accelerate:<file.yaml>`: a user's own Accelerate config (as `accelerate config` writes it) as a
strategy, run through Accelerate as that user's `accelerate launch --config_file <file>` runs are.

The file is read with Accelerate's own loader, and the settings `accelerate launch` would give
its processes are made by Accelerate's own launch code from it (launch_env); the Accelerate modes
(driver.py) then take them exactly as under `accelerate launch`, but the processes are the run's
(torchrun, nproc=, or a compare's), so the file's process count and machines give way to the run's.

What the file amounts to (choice): distributed_type MULTI_GPU or MULTI_CPU runs as accelerate-ddp,
FSDP (fsdp_version 2) as accelerate-fsdp, or accelerate-hsdp / accelerate-fsdp-tp where its
parallelism_config replicates or splits tensors, DEEPSPEED as accelerate-zero1-3 by its stage (from
deepspeed_config, or the DeepSpeed JSON its deepspeed_config_file names, which strategies/
deepspeed_file.py checks as for `deepspeed:<file.json>`; the JSON's scheduler sets the compare's
schedule shape, FileChoice.run_settings, and runs in zero_mode.py). Against the run (for_run): the
precision must be the run's; the file's accumulation is followed where it makes the global batch; MULTI_GPU
and MULTI_CPU follow the device the run is on; FSDP's CPU-RAM-efficient loading, which accelerate
launch turns on unless the file turns it off, is off (every rank builds the same seeded model); each
is said. What accelerate launch itself refuses in the file is refused in one line.
"""

from __future__ import annotations

import os
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from strategies import deepspeed_file
from strategies.accelerate.environment import ACCELERATE_PRECISION, PARALLELISM_SIZES, launched_by_accelerate
from strategies.accelerate.wrap_classes import KEY as WRAP_KEY
from strategies.accelerate.wrap_classes import check_wrap_classes
from strategies.base import RunContext, StrategyError
from strategies.config_files import FileChoice, follow_batch_split

if TYPE_CHECKING:
    import torch.nn as nn

# The variables of the launch environment that configure Accelerate itself (not the processes:
# those are the run's).
ENV_PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")
DDP_TYPES = ("MULTI_GPU", "MULTI_CPU")
DEEPSPEED_FILE_KEY = "deepspeed_config.deepspeed_config_file"
# What Accelerate's DeepSpeedPlugin refuses in an Accelerate config that names a DeepSpeed JSON.
IGNORED_BESIDE_JSON = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)
# Where a DeepSpeedPlugin is given no stage.
ACCELERATE_DEFAULT_ZERO_STAGE = 2
EFFICIENT_LOADING_OFF = (
    "every rank builds the same seeded model, so there is nothing to load on one rank alone (and Accelerate's "
    "reload from rank 0 would untie weights a model shares outside transformers)"
)


class FileRun(NamedTuple):
    """The file against the run (AccelerateFile.for_run)."""

    ctx: RunContext  # the run's context, with the file's batch split
    followed: list[str]  # what was followed, in words
    env: dict[str, str]  # the Accelerate settings `accelerate launch` would give the processes
    # The DeepSpeed JSON the file names, as deepspeed_file.for_run leaves it (its scheduler's "auto"
    # values filled from the run); None without one.
    deepspeed_json: dict[str, Any] | None


@dataclass(frozen=True)
class AccelerateFile:
    path: Path
    label: str  # how messages name it: accelerate:<path>
    config: Any  # Accelerate's ClusterConfig

    @classmethod
    def read(cls, path: Path, label: str) -> AccelerateFile:
        """The file as Accelerate's own loader reads it; its complaints as one line."""
        import accelerate
        from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

        try:
            config = load_config_from_file(str(path))
        except Exception as exc:  # yaml's, json's and Accelerate's own ValueErrors: one line, not a traceback
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StrategyError(
                f"{label}: Accelerate {accelerate.__version__} cannot read it ({first}): write it with "
                "`accelerate config --config_file <file>`"
            ) from None
        if not isinstance(config, ClusterConfig):
            raise StrategyError(
                f"{label} is for compute_environment {config.compute_environment.value}: parabench runs "
                "LOCAL_MACHINE configs"
            )
        file = cls(path, label, config)
        file._check_distributed_type()
        return file

    @property
    def distributed_type(self) -> str:
        return str(self.config.distributed_type.value)

    def _check_distributed_type(self) -> None:
        from accelerate.utils import DistributedType

        found = self.config.distributed_type
        if not isinstance(found, DistributedType):  # YAML reads a bare NO as false
            raise StrategyError(
                f"{self.label} sets distributed_type: {found!r}, which is none of Accelerate's: give MULTI_GPU, "
                "MULTI_CPU, FSDP or DEEPSPEED (quoted where YAML would read it otherwise)"
            )

    # ---- what the file amounts to -------------------------------------------------------------

    def choice(self) -> FileChoice:
        dynamo = (self.config.dynamo_config or {}).get("dynamo_backend", "NO")
        if str(dynamo).upper() != "NO":
            raise StrategyError(
                f"{self.label} sets dynamo_config.dynamo_backend: {dynamo}, which compiles the model in Accelerate: "
                "remove dynamo_config, and set compile=true for the whole compare to compile every strategy alike"
            )
        kind = self.distributed_type
        if kind in DDP_TYPES:
            return FileChoice("accelerate-ddp", f"Accelerate {kind}: DistributedDataParallel")
        if kind == "FSDP":
            return self._fsdp_choice()
        if kind == "DEEPSPEED":
            return self._deepspeed_choice()
        if kind == "NO":
            raise StrategyError(
                f"{self.label} sets distributed_type: NO, one process without distribution: set MULTI_GPU, FSDP or "
                "DEEPSPEED (the one-process reference is single)"
            )
        raise StrategyError(
            f"{self.label} sets distributed_type: {kind}, which parabench does not run: set MULTI_GPU, MULTI_CPU, "
            "FSDP or DEEPSPEED"
        )

    def _fsdp_choice(self) -> FileChoice:
        fsdp = self.config.fsdp_config
        version = fsdp.get("fsdp_version", 1)
        if str(version) != "2":
            raise StrategyError(
                f"{self.label} sets fsdp_config.fsdp_version: {version}: parabench runs Accelerate's FSDP2; set "
                f"fsdp_version: 2 (`accelerate to-fsdp2 --config_file {self.path} --output_file <new.yaml>` "
                "converts the other keys)"
            )
        if _true(fsdp.get("fsdp_offload_params")):
            raise StrategyError(
                f"{self.label} sets fsdp_config.fsdp_offload_params: true: accelerate-fsdp keeps the parameters on "
                "the device; set it false (fsdp-offload is FSDP2 with offload)"
            )
        if _true(fsdp.get("fsdp_activation_checkpointing")):
            raise StrategyError(
                f"{self.label} sets fsdp_config.fsdp_activation_checkpointing: true: parabench checkpoints the blocks "
                "itself, the same for every strategy; set it false, and activation_checkpointing=true for the "
                "whole compare"
            )
        sizes = self.parallelism_sizes()
        for key in ("cp_size", "sp_size"):
            if sizes.get(key, 1) > 1:
                raise StrategyError(
                    f"{self.label} sets parallelism_config.parallelism_config_{key}: {sizes[key]}: parabench "
                    "splits no sequences; set it to 1"
                )
        plan_changes = {} if _true(fsdp.get("fsdp_reshard_after_forward", True)) else {"reshard_after_forward": False}
        summary = "Accelerate driving FSDP2"
        summary += ", parameters kept gathered from forward to backward" if plan_changes else ""
        wrap = fsdp.get(WRAP_KEY)
        summary += f", one unit per {wrap}" if wrap else ""
        replicate, tp = sizes.get("dp_replicate_size", 1), sizes.get("tp_size", 1)
        if replicate > 1 and tp > 1:
            raise StrategyError(
                f"{self.label} sets parallelism_config_dp_replicate_size: {replicate} with parallelism_config_tp_size: "
                f"{tp}: parabench runs hybrid sharding (accelerate-hsdp) or tensor parallel (accelerate-fsdp-tp), "
                "not both; set one of them to 1"
            )
        if tp > 1:
            summary += f", tensor parallel over {tp}"
            keys = {"tp_size": "parallelism_config.parallelism_config_tp_size"}
            return FileChoice("accelerate-fsdp-tp", summary, {"tp_size": tp}, plan_changes, option_keys=keys)
        if replicate > 1:
            shard = sizes.get("dp_shard_size", 1)
            if shard == 1:  # Accelerate's own refusal, made before any process starts
                raise StrategyError(
                    f"{self.label} sets parallelism_config_dp_shard_size: 1 beside dp_replicate_size: {replicate}: "
                    "Accelerate's FSDP needs ranks to shard over; set dp_shard_size above 1, or distributed_type: "
                    "MULTI_GPU for replicas alone"
                )
            summary += f", hybrid: {replicate} replicas x {shard} shards"
            keys = {"shard_size": "parallelism_config.parallelism_config_dp_shard_size"}
            return FileChoice("accelerate-hsdp", summary, {"shard_size": shard}, plan_changes, option_keys=keys)
        return FileChoice("accelerate-fsdp", summary, {}, plan_changes)

    def parallelism_sizes(self) -> dict[str, int]:
        """The file's parallelism_config sizes (dp_replicate_size, ...), each a whole number."""
        found = {}
        for key in (*PARALLELISM_SIZES, "sp_size"):
            value = self.config.parallelism_config.get(f"parallelism_config_{key}", 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(
                    f"{self.label} sets parallelism_config.parallelism_config_{key}: {value!r}: give a whole number"
                )
            found[key] = value
        return found

    def _deepspeed_choice(self) -> FileChoice:
        deepspeed = self.config.deepspeed_config
        json_file = self.deepspeed_json()
        if json_file is not None:
            choice = deepspeed_file.choose(json_file, self.json_label(json_file))
            if choice.builtin not in ("zero1", "zero2", "zero3"):
                raise StrategyError(
                    f"{self.json_label(json_file)} runs as {choice.builtin}: parabench's Accelerate runs ZeRO without "
                    "offload or ZeRO++ (accelerate-zero1-3); set the offload devices to none and no ZeRO++, or "
                    f"compare deepspeed:{json_file}"
                )
            stage = int(choice.builtin[-1])
            summary = f"Accelerate driving DeepSpeed ZeRO-{stage} from {json_file.name}"
            # The JSON's scheduler sets the compare's schedule shape, as under deepspeed:<file.json>.
            return FileChoice(
                f"accelerate-zero{stage}",
                summary,
                files={DEEPSPEED_FILE_KEY: json_file},
                run_settings=choice.run_settings,
                run_settings_from=f"{choice.run_settings_from} in {json_file}" if choice.run_settings else "",
            )
        stage = deepspeed.get("zero_stage", ACCELERATE_DEFAULT_ZERO_STAGE)
        if stage not in (1, 2, 3):
            raise StrategyError(
                f"{self.label} sets deepspeed_config.zero_stage: {stage}: set 1, 2 or 3 (stage 0 is plain data "
                "parallel: MULTI_GPU)"
            )
        for key in ("offload_optimizer_device", "offload_param_device"):
            device = deepspeed.get(key, "none")
            if device != "none":
                raise StrategyError(
                    f"{self.label} sets deepspeed_config.{key}: {device}: parabench's Accelerate runs ZeRO without "
                    "offload (accelerate-zero1-3); set it to none, or compare zero2-offload, zero3-offload"
                )
        return FileChoice(f"accelerate-zero{stage}", f"Accelerate driving DeepSpeed ZeRO-{stage}")

    def deepspeed_json(self) -> Path | None:
        """The DeepSpeed JSON the file names (Accelerate opens it from the directory it runs in)."""
        named = self.config.deepspeed_config.get("deepspeed_config_file")
        if not named or named == "none":
            return None
        path = Path(named)
        if not path.is_file():
            raise StrategyError(
                f"{self.label} sets {DEEPSPEED_FILE_KEY}: {named}, which is not a file here (Accelerate opens it from "
                "the directory you run in): give its path from there"
            )
        return path

    def json_label(self, json_file: Path) -> str:
        """How messages name the DeepSpeed JSON the file names."""
        return f"{self.label}'s deepspeed_config_file {json_file}"

    # ---- against the run ------------------------------------------------------------------------

    def for_run(self, ctx: RunContext) -> FileRun:
        """The file against the run (FileRun), or a one-line error naming the key that contradicts it."""
        if launched_by_accelerate(os.environ):
            raise StrategyError(
                f"strategy {self.label} sets Accelerate up from the file itself: start it with torchrun or nproc=, "
                "not accelerate launch"
            )
        json_file = self.deepspeed_json() if self.distributed_type == "DEEPSPEED" else None
        if json_file is not None:  # the precision is the JSON's (checked with it)
            self._refuse_keys_beside_json()
        precision = self.config.mixed_precision or "no"
        wanted = ACCELERATE_PRECISION[ctx.precision]
        if json_file is None and str(precision).lower() != wanted:
            ours = {v: k for k, v in ACCELERATE_PRECISION.items()}.get(str(precision).lower())
            other = f"precision={ours} for the whole compare" if ours else f"a precision parabench has ({wanted})"
            raise StrategyError(
                f"{self.label} sets mixed_precision: {precision} but the run's precision is {ctx.precision}: set "
                f"mixed_precision: '{wanted}' in it, or {other}"
            )
        followed = self._device_and_processes(ctx)
        if self.distributed_type == "FSDP":
            sizes = self.parallelism_sizes()
            used = sizes["dp_replicate_size"] * sizes["dp_shard_size"] * sizes["tp_size"]
            if self.config.parallelism_config and used != ctx.world_size:
                laid_out = f"{sizes['dp_replicate_size']} x {sizes['dp_shard_size']} x {sizes['tp_size']}"
                raise StrategyError(
                    f"{self.label}'s parallelism_config lays out {laid_out} = {used} processes (dp_replicate x "
                    f"dp_shard x tp) but the run has {ctx.world_size}: set sizes that multiply to {ctx.world_size}"
                )
        deepspeed_json = None
        if self.distributed_type == "DEEPSPEED":
            ctx, more, deepspeed_json = self._deepspeed_for_run(ctx)
            followed += more
        env = self.launch_env(ctx)
        # From what accelerate launch sets, not from the file's keys: a file without the key gets the
        # launcher's default, which is on. Accelerate's reload re-ties tied weights only in a
        # transformers model (its tie_weights()): parabench's GPT, whose head shares the embedding,
        # would train them as two parameters.
        if _true(env.get("FSDP_CPU_RAM_EFFICIENT_LOADING")):
            env["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
            followed.append(f"{self._efficient_loading_setting()} is off here: {EFFICIENT_LOADING_OFF}")
        if self.distributed_type == "FSDP" and ctx.precision != "fp32":
            followed.append(
                f"mixed_precision: {ACCELERATE_PRECISION[ctx.precision]} under FSDP2: Accelerate's own policy, "
                f"gradients reduced in {ctx.precision} (accelerate-fsdp reduces them in fp32), as accelerate launch "
                "runs it"
            )
        return FileRun(ctx, followed, env, deepspeed_json)

    def _efficient_loading_setting(self) -> str:
        key = "fsdp_config.fsdp_cpu_ram_efficient_loading"
        if key.split(".")[1] in self.config.fsdp_config:
            return f"{key}: true"
        return f"{key} (not in the file: accelerate launch's default, true)"

    def _refuse_keys_beside_json(self) -> None:
        """What Accelerate refuses beside a deepspeed_config_file (DeepSpeedPlugin, which would say it
        in five lines from every rank): those settings are the JSON's."""
        beside = [f"deepspeed_config.{key}" for key in IGNORED_BESIDE_JSON if key in self.config.deepspeed_config]
        beside += ["mixed_precision"] if self.config.mixed_precision is not None else []
        if beside:
            raise StrategyError(
                f"{self.label} sets {beside[0]} beside {DEEPSPEED_FILE_KEY}, whose DeepSpeed JSON says it: remove it "
                "from the Accelerate config (as `accelerate config` writes one that names a JSON)"
            )

    def _device_and_processes(self, ctx: RunContext) -> list[str]:
        followed = []
        kind, device = self.distributed_type, ctx.device.type
        if self.config.use_cpu and kind not in DDP_TYPES:
            raise StrategyError(
                f"{self.label} sets use_cpu: true, which makes Accelerate drop {kind}: set it false (parabench runs "
                f"{kind} over gloo on a CPU)"
            )
        if kind == "MULTI_GPU" and device == "cpu":
            followed.append(
                "distributed_type MULTI_GPU, on a machine without GPUs: DistributedDataParallel over gloo on the CPU "
                "(Accelerate's MULTI_CPU), as accelerate launch runs it there"
            )
        if kind == "MULTI_CPU" and device == "cuda":
            followed.append(
                "distributed_type MULTI_CPU, on GPUs: DistributedDataParallel over NCCL on them (Accelerate's "
                "MULTI_GPU), as every other strategy of the run"
            )
        processes = self.config.num_processes
        if processes > 0 and processes != ctx.world_size:
            followed.append(f"num_processes: {processes}: the run's {ctx.world_size} processes instead")
        if self.config.num_machines > 1:
            followed.append(f"num_machines: {self.config.num_machines}: the machines the run is started on instead")
        if self.config.gpu_ids not in (None, "all"):
            followed.append(f"gpu_ids: {self.config.gpu_ids}: the devices the run is started on instead")
        if (self.config.mpirun_config or {}).get("mpirun_hostfile"):
            followed.append("mpirun_config: the run's own launcher starts the processes instead of mpirun")
        return followed

    def _deepspeed_for_run(self, ctx: RunContext) -> tuple[RunContext, list[str], dict[str, Any] | None]:
        deepspeed = self.config.deepspeed_config
        followed = []
        clipping = deepspeed.get("gradient_clipping")
        if clipping is not None and float(clipping) != ctx.grad_clip:
            raise StrategyError(
                f"{self.label} sets deepspeed_config.gradient_clipping: {clipping} but the run clips at grad_clip="
                f"{ctx.grad_clip}: set it to {ctx.grad_clip}, or grad_clip={clipping} for the whole compare"
            )
        ctx, split = follow_batch_split(
            ctx,
            micro_batch=None,
            grad_accum=deepspeed.get("gradient_accumulation_steps"),
            keys=("train_micro_batch_size_per_gpu", "deepspeed_config.gradient_accumulation_steps"),
            where=self.label,
        )
        followed += [split] if split else []
        if _true(deepspeed.get("zero3_init_flag")):
            followed.append(
                "deepspeed_config.zero3_init_flag: true changes nothing here: the model is built before the engine, "
                "the same for every strategy"
            )
        json_file = self.deepspeed_json()
        if json_file is None:
            return ctx, followed, None
        json_config, ctx, more = deepspeed_file.for_run(deepspeed_file.read(json_file), ctx, self.json_label(json_file))
        return ctx, followed + more, json_config

    def launch_env(self, ctx: RunContext) -> dict[str, str]:
        """The ACCELERATE_*, FSDP_* and PARALLELISM_CONFIG_* settings `accelerate launch --config_file`
        gives its processes, made by Accelerate's own launch code, for the run's processes and device."""
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils.launch import (
            prepare_deepspeed_cmd_env,
            prepare_multi_gpu_env,
            prepare_simple_launcher_cmd_env,
        )

        argv = ["--config_file", str(self.path), "--num_processes", str(ctx.world_size), "--num_machines", "1"]
        argv += ["--machine_rank", "0", "--main_process_port", "0"]
        if self.distributed_type == "MULTI_CPU" and ctx.device.type == "cuda":
            argv.append("--multi_gpu")  # the run's device, not the file's
        args = launch_command_parser().parse_args([*argv, "runner.py", "train"])
        try:
            with redirect_stdout(sys.stderr):  # what Accelerate says about defaults: with the libraries' output
                args, defaults, precision_from_config = _validate_launch_command(args)
                if args.use_deepspeed and not args.cpu:  # as launch_command hands them to its DeepSpeed launcher
                    fields = [*defaults.deepspeed_config, *(["mixed_precision"] if precision_from_config else [])]
                    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                    _, env = prepare_deepspeed_cmd_env(args)
                elif (args.use_fsdp or args.multi_gpu) and not args.cpu:
                    env = prepare_multi_gpu_env(args)
                else:
                    _, env = prepare_simple_launcher_cmd_env(args)
        except ValueError as exc:  # accelerate launch's own refusals, which name its flags: the file's keys
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].replace("`--", "`")
            raise StrategyError(
                f"{self.label}: accelerate launch refuses it ({first}): change those keys in the file"
            ) from None
        return {key: value for key, value in env.items() if key.startswith(ENV_PREFIXES)}

    def check_model(self, model: nn.Module, blocks: list[str] | None = None) -> None:
        """The block classes the file wraps by name must be the model's (`blocks`: its blocks' classes,
        offered first)."""
        names = self.config.fsdp_config.get(WRAP_KEY)
        if self.distributed_type != "FSDP" or not names:
            return
        check_wrap_classes(model, names, f"{self.label} sets fsdp_config.", blocks)


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1")
