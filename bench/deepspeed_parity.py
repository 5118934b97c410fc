#!/usr/bin/env python3
"""Does parabench hand DeepSpeed the config a hand-written loop would? Every setting that differs
between the config a run gave `deepspeed.initialize` (its <out_dir>/deepspeed_config.json, written
by zero1-3 and by the accelerate-zero1-3 modes, which record what Accelerate passed on) and the one
bench/handwritten/zero.py builds for the same run, compared on the values DeepSpeed will use.

    python bench/deepspeed_parity.py runs/x           # a run's config against zero.py's: every difference
    python bench/deepspeed_parity.py --documented     # the differences parabench means to have, as a table

Both sides are filled with DeepSpeed's own defaults by DeepSpeed's own config parser, so a key
one side writes and the other leaves at its default is no difference, and a default one side
overrides is. Every difference must be in DOCUMENTED_DIFFERENCES with its reason;
tests/strategies/test_deepspeed_parity.py fails on any other.
"""

from __future__ import annotations

import argparse
import copy
import enum
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HAND = ROOT / "bench" / "handwritten"
CONFIG_FILE = "deepspeed_config.json"  # what a run writes (strategies/deepspeed.py)

# Setting (as DeepSpeed reads it, JSON-style path) -> why parabench's value differs from zero.py's.
# A key covers everything under it.
DOCUMENTED_DIFFERENCES: dict[str, str] = {
    "zero_optimization.reduce_bucket_size": "the model's size for ZeRO-1/2 (one reduction per step, as the default "
    "gives any model under 5e8 parameters, without allocating a 5e8-element bucket for a smaller one), one rank's "
    "share for ZeRO-3 (its bucket lives all run: no more memory than the gradient partition; on one rank the "
    "model's size again); at most DeepSpeed's 5e8 elements (strategies/deepspeed_config.py sizing_config)",
    "zero_optimization.stage3_param_persistence_threshold": "ZeRO-3 only, and only for models whose width x width "
    "is at most DeepSpeed's threshold (1e5 elements; gpt-nano, not gpt2-124m): 10 x the width, else every matrix "
    "would stay whole and ZeRO-3 would shard nothing",
    "zero_optimization.offload_optimizer": "parabench writes `device: none` so that the file says what was not "
    "offloaded; DeepSpeed offloads only for a device other than none, the same step as without the section",
    "zero_optimization.offload_param": "as offload_optimizer (parabench writes it for ZeRO-3, Accelerate's plugin "
    "for every stage): device none",
    "zero_allow_untested_optimizer": "zero.py sets it, as many DeepSpeed scripts do, and so does Accelerate; "
    "parabench does not need it: torch.optim.AdamW is on DeepSpeed's list of ZeRO optimizers, so the flag changes "
    "nothing here",
    "timers.throughput.enabled": "off: parabench measures throughput itself, syncing only at the logging interval; "
    "DeepSpeed's own timer synchronizes the device at the start and end of every step (both sides paid it before)",
    "steps_per_print": "never printed on either side: DeepSpeed's default (None) in parabench, 2**30 in zero.py, "
    "infinity "
    "from Accelerate's plugin",
}

# DeepSpeedConfig's attribute names for the sections whose JSON names differ.
_SECTION_NAMES = {
    "zero_config": "zero_optimization",
    "bfloat16_config": "bf16",
    "float16_config": "fp16",
    "timers_config": "timers.throughput",
}


def effective_config(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Every setting DeepSpeed reads from `config`, defaults filled, as {dotted path: value}.

    DeepSpeed's own parser (DeepSpeedConfig) fills the defaults; its constructor takes the world
    size from an initialised process group, so the two steps it runs are called here with the
    run's world size instead (private methods: if DeepSpeed renames them, this fails loudly).
    """
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig.__new__(DeepSpeedConfig)
    parsed.world_size, parsed.global_rank = world_size, 0
    parsed._param_dict = config
    parsed._initialize_params(copy.deepcopy(config))
    parsed._configure_train_batch_size()  # fills and checks the three batch keys
    return _flatten(parsed, "")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    import torch
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)  # JSON names: stage3_param_persistence_threshold, ...
    elif hasattr(value, "__dict__") and not isinstance(value, (enum.Enum, torch.dtype, type)):
        value = {k: v for k, v in vars(value).items() if not k.startswith("_")}
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _SECTION_NAMES.get(key, key) if not prefix else key
        out.update(_flatten(item, f"{prefix}.{name}" if prefix else name))
    return out


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{path: (our value, their value)} for every effective setting that differs. A section one
    side leaves unset (None, as DeepSpeed's optional offload sections) and the other fills is one
    difference at the section's path, not one per key inside it."""
    diffs: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) == theirs.get(key):
            continue
        prefixes = [".".join(key.split(".")[:n]) for n in range(1, key.count(".") + 1)]
        section = next((p for p in prefixes if p in ours or p in theirs), None)
        if section is None:
            diffs[key] = (ours.get(key), theirs.get(key))
        else:
            diffs[section] = (_subtree(ours, section), _subtree(theirs, section))
    return diffs


def _subtree(flat: dict[str, Any], path: str) -> Any:
    if path in flat:
        return flat[path]
    return {k[len(path) + 1 :]: v for k, v in flat.items() if k.startswith(path + ".")}


def is_documented(path: str) -> bool:
    return any(path == key or path.startswith(key + ".") for key in DOCUMENTED_DIFFERENCES)


def _zero_py() -> ModuleType:
    """bench/handwritten/zero.py as a module (it imports its sibling _common by name)."""
    if str(HAND) not in sys.path:
        sys.path.insert(0, str(HAND))
    spec = importlib.util.spec_from_file_location("handwritten_zero", HAND / "zero.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def handwritten_config(
    *, stage: int, precision: str, micro_batch: int, grad_clip: float, world_size: int
) -> dict[str, Any]:
    """The config zero.py's ds_config(args, world) builds for these settings (no --ds-config)."""
    args = SimpleNamespace(
        stage=stage, precision=precision, micro_batch=micro_batch, grad_clip=grad_clip, ds_config=None
    )
    return _zero_py().ds_config(args, world_size)


def run_differences(out_dir: Path) -> dict[str, tuple[Any, Any]]:
    """A finished run's DeepSpeed config against zero.py's for the same stage, batch, precision and clipping."""
    ours = json.loads((out_dir / CONFIG_FILE).read_text())
    summary = json.loads((out_dir / "summary.json").read_text())
    if summary["grad_accum"] != 1:
        raise SystemExit(f"{out_dir}: zero.py does not accumulate; compare a run with grad_accum=1")
    world = summary["world_size"]
    theirs = handwritten_config(
        stage=ours["zero_optimization"]["stage"],
        precision=summary["config"]["precision"],
        micro_batch=summary["micro_batch"],
        grad_clip=summary["config"]["grad_clip"],
        world_size=world,
    )
    return differences(effective_config(ours, world), effective_config(theirs, world))


def documented_table() -> str:
    lines = ["| setting | why parabench differs from bench/handwritten/zero.py |", "|---|---|"]
    lines += [f"| `{key}` | {reason} |" for key, reason in DOCUMENTED_DIFFERENCES.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", help="a zero1-3 or accelerate-zero1-3 run's out_dir")
    p.add_argument("--documented", action="store_true", help="print the documented differences and exit")
    args = p.parse_args(argv)
    if args.documented or not args.out_dir:
        print(documented_table())
        return 0
    diffs = run_differences(Path(args.out_dir))
    for path, (ours, theirs) in diffs.items():
        print(
            f"{'documented  ' if is_documented(path) else 'UNDOCUMENTED'} {path}: parabench {ours!r}, "
            f"zero.py {theirs!r}"
        )
    return 1 if any(not is_documented(p) for p in diffs) else 0


if __name__ == "__main__":
    sys.exit(main())
