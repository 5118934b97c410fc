"""What makes a finished run reusable: its configuration's identity, everything that changes
what the run measures. A compare records it in each run folder (run.json) and, with
resume=auto, keeps a finished run only where the identity is the same today.

In it: every option of the run (model, data, seed, batch, steps, precision, the learning
rate, the strategy and its options, the noise seed, ...), the world size, the nodes and the
device type, the versions of torch, DeepSpeed and Accelerate, and the content of every file
an option names (a token file, a DeepSpeed JSON, a strategy named by its config file as in
`accelerate:my.yaml`, and the files that config file names in turn, such as the DeepSpeed JSON of
an Accelerate config): a changed file is a changed configuration. Not in it: where the run
writes (its out_dir, and the tracker group and MLflow store the compare names after it), how
long it may take, how often it logs and checkpoints.

The identity is flat (`strategy_options.bucket_cap_mb`, `versions.torch`, `file.data`), so a
difference names its key: "steps was 30, now 40".
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from configs.schema import ConfigError

# Options that change nothing a run measures.
NEUTRAL_KEYS = frozenset(
    {"out_dir", "pg_timeout_s", "log_every", "checkpoint_every", "keep_last", "resume", "nproc", "device"}
)
# Options a compare names after its out_dir where the user leaves them unset (its runs' tracker group, their
# MLflow store in it: compare_config.out_dir_named): where the runs log, like out_dir itself, not what they
# measure. Named so, they are left out of a run's identity, so that a compare copied or renamed resumes.
OUT_DIR_NAMED = ("tracker_group", "tracker_uri")
VERSIONED = ("torch", "deepspeed", "accelerate")
# Files up to this size are hashed whole; a larger one (a token file of many GB) by its size and
# the hash of its first and last FINGERPRINT_ENDS bytes, not read whole at every compare start.
FINGERPRINT_WHOLE = 256 << 20
FINGERPRINT_ENDS = 16 << 20
_UNSET = object()


class ConfigurationChanged(ConfigError):
    """An out_dir holds runs of a configuration other than this compare's (one line, names the keys)."""


def run_identity(
    options: dict[str, Any],
    *,
    world_size: int,
    nodes: int,
    device_type: str,
    versions: dict[str, Any],
    files: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """The flat identity of one run whose configuration is `options` (RunConfig's keys, the
    strategy's own options merged into strategy_options); `files` are further files the run
    reads, by the key that names them (the DeepSpeed JSON an Accelerate config names)."""
    identity = _flat({k: v for k, v in options.items() if k not in NEUTRAL_KEYS})
    identity.update(world_size=world_size, nodes=nodes, device_type=device_type)
    identity.update({f"versions.{name}": versions.get(name) for name in VERSIONED})
    for key, value in list(identity.items()):
        named = _named_file(value)
        if named is not None:
            identity[f"file.{key}"] = fingerprint(named)
    for key, path in (files or {}).items():
        identity[f"file.{key}"] = fingerprint(path)
    return json.loads(json.dumps(identity))  # as run.json will read back: lists, not tuples


def recorded_as_now(recorded: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """A run.json's identity as this compare's (`now`) is held to it: without the out_dir-named options
    `now` leaves out. A record holds them where it was written before they were left out (the earlier
    folder's name), or where the user had set them."""
    return {key: value for key, value in recorded.items() if key in now or key not in OUT_DIR_NAMED}


def identity_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'key was X, now Y' for each key whose value changed, in `now`'s order."""
    keys = [k for k in dict.fromkeys([*now, *before]) if before.get(k, _UNSET) != now.get(k, _UNSET)]
    return [f"{k} was {_shown(before.get(k, _UNSET))}, now {_shown(now.get(k, _UNSET))}" for k in keys]


def changed_configuration(
    out_dir: Path, label: str, before: dict[str, Any], now: dict[str, Any]
) -> ConfigurationChanged:
    """The one-line error for a run folder of `out_dir` whose configuration differs from this compare's."""
    found = differences(before, now)
    listed = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    return ConfigurationChanged(
        f"{out_dir} holds a compare of another configuration ({label}: {listed}): use the old "
        f"value{'s' if len(found) > 1 else ''}, or another out_dir, or resume=never to run it all again there"
    )


def fingerprint(path: Path) -> str:
    """The content of `path` as a short string: its sha256, or for a large file its size and the
    sha256 of its two ends."""
    stat = path.resolve().stat()
    return _fingerprint(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _fingerprint(path: str, size: int, mtime_ns: int) -> str:
    # Cached by path, size and modification time: every run of a sweep names the same data file.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FINGERPRINT_WHOLE:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
            return f"sha256:{digest.hexdigest()[:16]}"
        digest.update(f.read(FINGERPRINT_ENDS))
        f.seek(size - FINGERPRINT_ENDS)
        digest.update(f.read(FINGERPRINT_ENDS))
    return f"{size} bytes, ends sha256:{digest.hexdigest()[:16]}"


def _named_file(value: Any) -> Path | None:
    """The file a string option names: the whole value, or what follows `kind:` in it."""
    if not isinstance(value, str) or not value:
        return None
    for candidate in (value, value.partition(":")[2]):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _flat(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict):  # an empty section adds nothing: as if its keys were unset
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    return json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
