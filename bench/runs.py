"""What the bench scripts run: each benchmark run (a `runner.py train` configuration and the
hand-written loop it is held to), the named groups of them that each take a few minutes on a
GPU, and the settings both sides share, with the two command lines built from them.

bench/overhead.py times both sides on a GPU; bench/profile_step.py profiles both on the CPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HAND = ROOT / "bench" / "handwritten"
GOAL_COMPILE_MFU = 0.40


@dataclass(frozen=True)
class Run:
    """One line of the table: a runner configuration and the hand-written loop it is held to."""

    name: str
    runner: tuple[str, ...]  # key=value overrides for `runner.py train`
    script: str  # bench/handwritten/<script>
    hand: tuple[str, ...] = ()  # extra arguments of the hand-written loop
    torchrun: bool = True  # the hand-written loop runs under torchrun (single GPU: plain python)
    kind: str = "strategy"  # "strategy" (the overhead goal) or "fast path"
    goal_mfu: float | None = None  # an MFU goal for the parabench side
    native: str | None = None  # accelerate-X: the run of native X whose parabench tokens/s it is held to
    note: str = ""

    @property
    def hand_key(self) -> tuple[str, tuple[str, ...], bool]:
        """Runs with equal keys share one hand-written process (accelerate-X and X)."""
        return self.script, self.hand, self.torchrun


RUNS: list[Run] = [
    # Every strategy, eager: parabench against the same backend written by hand.
    Run("single", ("strategy=single",), "plain.py", torchrun=False),
    Run("ddp", ("strategy=ddp",), "ddp.py"),
    Run("fsdp", ("strategy=fsdp",), "fsdp.py"),
    Run("zero1", ("strategy=zero1",), "zero.py", ("--stage", "1")),
    Run("zero2", ("strategy=zero2",), "zero.py", ("--stage", "2")),
    Run("zero3", ("strategy=zero3",), "zero.py", ("--stage", "3")),
    # The same backends through Accelerate, held to the native backend's hand-written loop and
    # to native X's parabench tokens/s in the same benchmark.
    Run("accelerate-ddp", ("strategy=accelerate-ddp",), "ddp.py", native="ddp"),
    Run("accelerate-fsdp", ("strategy=accelerate-fsdp",), "fsdp.py", native="fsdp"),
    Run("accelerate-zero1", ("strategy=accelerate-zero1",), "zero.py", ("--stage", "1"), native="zero1"),
    Run("accelerate-zero2", ("strategy=accelerate-zero2",), "zero.py", ("--stage", "2"), native="zero2"),
    Run("accelerate-zero3", ("strategy=accelerate-zero3",), "zero.py", ("--stage", "3"), native="zero3"),
    # Fast-path options parabench has (configs/schema.py, registered names, deepspeed_config),
    # each against the same option by hand.
    Run(
        "zero3-tuned",
        ("strategy=zero3", "deepspeed_config=bench/presets/zero3_tuned.json"),
        "zero.py",
        ("--stage", "3", "--ds-config", "bench/presets/zero3_tuned.json"),
        kind="fast path",
        note="bench/presets/zero3_tuned.json merged over each side's DeepSpeed config",
    ),
    Run(
        "single+ac",
        ("strategy=single", "activation_checkpointing=true"),
        "plain.py",
        ("--activation-checkpointing",),
        torchrun=False,
        kind="fast path",
    ),
    Run(
        "fsdp-grad-op",
        ("strategy=fsdp-grad-op",),
        "fsdp.py",
        ("--no-reshard-after-forward",),
        kind="fast path",
        note="FSDP2 reshard_after_forward=False (gathered parameters kept from forward to backward)",
    ),
    Run(
        "single+compile",
        ("strategy=single", "compile=true"),
        "plain.py",
        ("--compile",),
        torchrun=False,
        kind="fast path",
        goal_mfu=GOAL_COMPILE_MFU,
        note="both sides compile the whole model, loss included",
    ),
    Run(
        "ddp+compile",
        ("strategy=ddp", "compile=true"),
        "ddp.py",
        ("--compile",),
        kind="fast path",
        goal_mfu=GOAL_COMPILE_MFU,
        note="both sides compile the whole model, then wrap it (nanoGPT's order); at world size 1 parabench "
        "compiles one graph, the hand-written loop lets DDPOptimizer split it at DDP's buckets (14 graphs)",
    ),
    Run(
        "fsdp+compile",
        ("strategy=fsdp", "compile=true"),
        "fsdp.py",
        ("--compile",),
        kind="fast path",
        note="both sides compile per block before sharding",
    ),
]
RUN_NAMES = {r.name: r for r in RUNS}

# Groups of a few minutes each on a GPU (bench/README.md). Wall times on an H100, per process with
# start-up: torch runs 13-23 s, DeepSpeed 23-34 s (its start-up dominates), compile 32-45 s. Each
# group runs native X beside accelerate-X, as the accelerate rows are judged against it.
GROUPS: dict[str, tuple[str, ...]] = {
    # 5 hand-written + 7 parabench processes: ~230 s a repeat.
    "torch": ("single", "ddp", "fsdp", "accelerate-ddp", "accelerate-fsdp", "single+ac", "fsdp-grad-op"),
    # 2 + 4: ~165 s a repeat.
    "zero12": ("zero1", "zero2", "accelerate-zero1", "accelerate-zero2"),
    # 2 + 3: ~160 s a repeat.
    "zero3": ("zero3", "accelerate-zero3", "zero3-tuned"),
    # 2 + 2: ~160 s a repeat (the first compile of each side fills inductor's cache).
    "compile": ("single+compile", "ddp+compile"),
}
DEFAULT_RUNS = tuple(name for group in GROUPS.values() for name in group)


def select(only: str | None = None, group: str | None = None) -> list[Run]:
    """The runs of --only (names, or all), else of --group, else the default set (every group)."""
    if only and group:
        raise SystemExit("give --only or --group, not both")
    if group:
        if group not in GROUPS:
            raise SystemExit(f"unknown group {group}: the groups are {', '.join(GROUPS)}")
        return [RUN_NAMES[n] for n in GROUPS[group]]
    if not only:
        return [r for r in RUNS if r.name in DEFAULT_RUNS]
    if only == "all":
        return list(RUNS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUN_NAMES]
    if unknown:
        raise SystemExit(f"unknown run {', '.join(unknown)}: the runs are {', '.join(RUN_NAMES)} (or all)")
    return [RUN_NAMES[n] for n in names]


@dataclass
class Settings:
    """What both sides of every run share."""

    model: str
    micro_batch: int  # per rank
    seq_len: int
    steps: int
    warmup: int
    data_samples: int
    precision: str
    device: str
    world_size: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    lr_warmup: int = 2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1337

    def runner_args(self, out_dir: Path) -> list[str]:
        return [
            f"model={self.model}",
            f"precision={self.precision}",
            f"device={self.device}",
            f"nproc={self.world_size}",
            f"seq_len={self.seq_len}",
            f"batch_size={self.micro_batch * self.world_size}",
            f"micro_batch={self.micro_batch}",
            f"steps={self.steps}",
            f"timing_warmup={self.warmup}",
            f"data_samples={self.data_samples}",
            f"lr={self.lr}",
            f"min_lr={self.min_lr}",
            f"warmup_steps={self.lr_warmup}",
            f"weight_decay={self.weight_decay}",
            f"beta1={self.beta1}",
            f"beta2={self.beta2}",
            f"grad_clip={self.grad_clip}",
            f"seed={self.seed}",
            # One flush at the end of warm-up and one at the last step: no other host sync.
            f"log_every={self.steps + 1000}",
            f"out_dir={out_dir}",
        ]

    def hand_args(self) -> list[str]:
        return [
            "--model",
            self.model,
            "--precision",
            self.precision,
            "--device",
            self.device,
            "--seq-len",
            str(self.seq_len),
            "--micro-batch",
            str(self.micro_batch),
            "--steps",
            str(self.steps),
            "--warmup",
            str(self.warmup),
            "--data-samples",
            str(self.data_samples),
            "--lr",
            str(self.lr),
            "--min-lr",
            str(self.min_lr),
            "--lr-warmup",
            str(self.lr_warmup),
            "--weight-decay",
            str(self.weight_decay),
            "--beta1",
            str(self.beta1),
            "--beta2",
            str(self.beta2),
            "--grad-clip",
            str(self.grad_clip),
            "--seed",
            str(self.seed),
        ]


def hand_command(run: Run, s: Settings, extra: list[str] | None = None) -> list[str]:
    """The hand-written loop of `run`: under torchrun with world_size processes, or plain python."""
    if run.torchrun:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={s.world_size}"]
    elif s.world_size == 1:
        prefix = [sys.executable]
    else:
        raise SystemExit(f"{run.name}: handwritten/{run.script} runs one process, not {s.world_size}")
    return [*prefix, str(HAND / run.script), *s.hand_args(), *run.hand, *(extra or [])]


def runner_command(run: Run, s: Settings, out_dir: Path, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, str(ROOT / "runner.py"), "train", *s.runner_args(out_dir), *run.runner, *(extra or [])]
