"""`runner.py export <checkpoint> <file.safetensors>`: one consolidated fp32 state dict.

Reads any strategy's checkpoint offline (one process, no GPU, any world size it was
saved at), through the strategy's own reader, and writes the weights under the bare
model's parameter names: `build_model(...).load_state_dict(load_file(f), strict=True)`
works on the result. The file's metadata records the model spec it loads into.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from harness.common.writable import CHOOSE_ANOTHER, FolderError, check_writable
from harness.train.checkpoint import STATE_DIR, CheckpointError, reading, verify
from models.zoo import build_model
from strategies.registry import default_registry

USAGE = "usage: runner.py export <checkpoint directory> <file.safetensors>"


def consolidated_weights(checkpoint: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The checkpoint's weights as fp32 CPU tensors keyed like the bare model, and metadata."""
    manifest = verify(checkpoint)
    entry = default_registry().get(manifest.strategy)
    if entry.cls is None or entry.unavailable_reason:
        raise CheckpointError(
            f"checkpoint {checkpoint} was written by {manifest.strategy}, unavailable here: {entry.unavailable_reason}"
        )
    spec, kwargs = manifest.config["model"], manifest.config.get("model_kwargs") or {}
    model = build_model(spec, kwargs)
    with reading(checkpoint, fix="export another checkpoint"):
        state = entry.cls.read_full_state_dict(checkpoint / STATE_DIR, model)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"checkpoint {checkpoint} does not fit model {spec}: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )
    # Cloned one by one: tied weights (embedding and head) become two equal tensors, which
    # safetensors can store and a strict load expects, rather than one shared storage.
    weights = {
        name: (t.detach().float() if t.is_floating_point() else t.detach()).contiguous().clone()
        for name, t in model.state_dict().items()
    }
    metadata = {
        "model": spec,
        "model_kwargs": json.dumps(kwargs),
        "step": str(manifest.step),
        "strategy": manifest.strategy,
        "format": "pt",
    }
    return weights, metadata


def main(args: list[str]) -> int:
    if len(args) != 2:
        raise ValueError(f"export takes a checkpoint and an output file: {USAGE}")
    checkpoint, target = Path(args[0]), Path(args[1])
    if target.name == ".safetensors":
        raise ValueError(f"output {target} has no name before .safetensors: give one, e.g. model.safetensors")
    if target.suffix != ".safetensors":
        raise ValueError(f"output {target} should end in .safetensors: {USAGE}")
    if target.exists():
        raise ValueError(f"output {target} already exists: choose another name or remove it first")
    if not target.parent.is_dir():
        raise ValueError(f"output directory {target.parent} does not exist: create it first")
    # Before the checkpoint is read: a folder that takes no files (/proc, read-only) is one line now.
    check_writable(target.parent, what=f"output directory {target.parent}", create=False)
    weights, metadata = consolidated_weights(checkpoint)
    partial = target.with_name(f".{target.name}.partial")
    try:
        save_file(weights, str(partial), metadata=metadata)
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, target)
        mask = os.umask(0)  # safetensors creates its file for its owner alone; give it the user's usual mode
        os.umask(mask)
        os.chmod(target, 0o666 & ~mask)
    except (SafetensorError, OSError) as exc:  # a disk that filled up, a folder that went away
        partial.unlink(missing_ok=True)
        raise FolderError(f"could not write {target} ({exc}): free space there, or {CHOOSE_ANOTHER}") from None
    n = sum(t.numel() for t in weights.values())
    print(
        f"wrote {target}: {len(weights)} tensors, {n:,} values (fp32), model {metadata['model']} "
        f"at step {metadata['step']}"
    )
    return 0
