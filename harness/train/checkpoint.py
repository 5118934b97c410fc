"""Checkpoints that are either complete or invisible, checked before use, rotated safely.

Layout of one checkpoint, `<out_dir>/checkpoints/step_<N>/` (N optimizer steps done):

    state/            what the strategy's save() wrote, in the backend's own format
    rng/rank_<r>.pt   every random generator of rank r
    manifest.json     step, strategy, format, world size, the run's config, the
                      model's parameter shapes, and every other file's size and sha256

Every rank writes into `.tmp-step_<N>`; rank 0 then hashes and fsyncs each file,
writes the manifest last, and renames the directory into place. So a `step_<N>`
directory never holds a half-written checkpoint, and its manifest says whether
it is still intact. Decisions that touch the file system are rank 0's and are
broadcast, so every rank acts on the same checkpoint and raises the same error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType
from typing import Any, Callable, Iterator, TypeVar

import torch.distributed as dist
import torch.nn as nn
import torch.serialization

from configs.schema import BOOLEAN_WORDS
from harness.common.numbers import is_whole
from harness.train import rng
from strategies.base import Strategy
from strategies.registry import default_registry

MANIFEST = "manifest.json"
STATE_DIR = "state"
RNG_DIR = "rng"
CHECKPOINTS = "checkpoints"  # in a run's out_dir
SUMMARY = "summary.json"  # what a finished run leaves in its out_dir (loop.py)
FORMAT_VERSION = 1
ANOTHER = "resume from another checkpoint"  # what to do about a damaged one
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL_PREFIXES = (".tmp-", ".deleting-")
# Keys that may change between a checkpoint and the run resuming it without changing the
# numbers (where and how the run is launched, logged and checkpointed).
_NEUTRAL_KEYS = {
    "strategy",
    "strategy_options",
    "deepspeed_config",
    "nproc",
    "device",
    "pg_timeout_s",
    "out_dir",
    "log_every",
    "timing_warmup",
    "tensorboard",
    "trackers",
    "tracker_project",
    "tracker_group",
    "tracker_uri",
    "verbose",
    "checkpoint_every",
    "keep_last",
    "resume",
    "micro_batch",
    "grad_accum",
}

T = TypeVar("T")


def _changes_numbers(key: str, config: dict[str, Any], saved: dict[str, Any]) -> bool:
    """Whether the resuming run's `key` differs from the checkpoint's in a way that changes the numbers:
    the fp8_ settings do only where one of the two runs trains in fp8."""
    if key in _NEUTRAL_KEYS or config[key] == saved.get(key):
        return False
    return not key.startswith("fp8_") or "fp8" in (config.get("precision"), saved.get("precision"))


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or used (one line, says what to do)."""


@dataclass(frozen=True)
class Manifest:
    step: int
    strategy: str
    checkpoint_format: str
    world_size: int
    config: dict[str, Any]
    param_shapes: dict[str, list[int]]
    files: dict[str, dict[str, Any]]  # path inside the checkpoint -> {"bytes": int, "sha256": str}
    format_version: int = FORMAT_VERSION

    @classmethod
    def read(cls, path: Path) -> Manifest:
        try:
            data = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{path} has no {MANIFEST}: {_not_a_checkpoint(path)}") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}/{MANIFEST} is unreadable ({exc})") from None
        if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{path}/{MANIFEST} is not a version-{FORMAT_VERSION} parabench manifest")
        try:
            manifest = cls(**data)
        except TypeError as exc:
            raise CheckpointError(f"{path}/{MANIFEST} does not have the fields of a manifest ({exc})") from None
        listed = manifest.files
        if not isinstance(listed, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
            for v in listed.values()
        ):
            raise CheckpointError(f"{path}/{MANIFEST} does not list its files as {{path: {{bytes, sha256}}}}")
        wrong = manifest._wrong_field()
        if wrong:
            raise CheckpointError(f"checkpoint {path} is damaged: {MANIFEST}'s {wrong}: {ANOTHER}")
        return manifest

    def _wrong_field(self) -> str | None:
        """The first field whose value is not of its kind (a hand-edited or damaged manifest)."""

        if not is_whole(self.step, 0):
            return f"step is {self.step!r}, not a whole number of 0 or more"
        if not is_whole(self.world_size, 1):
            return f"world_size is {self.world_size!r}, not a whole number of 1 or more"
        for name in ("strategy", "checkpoint_format"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                return f"{name} is {getattr(self, name)!r}, not a name"
        if not isinstance(self.config, dict) or not isinstance(self.config.get("model"), str):
            return "config does not name its model"
        shapes = self.param_shapes
        if not isinstance(shapes, dict) or not all(
            isinstance(v, list) and all(is_whole(d, 0) for d in v) for v in shapes.values()
        ):
            return "param_shapes is not {name: [sizes]}"
        return None

    def write(self, path: Path) -> None:
        with open(path / MANIFEST, "w") as f:
            json.dump(asdict(self), f, indent=1)
            f.flush()
            os.fsync(f.fileno())


def _not_a_checkpoint(path: Path) -> str:
    """What a folder without a manifest is, and what to give instead: for a run's out_dir (or its
    checkpoints folder), its newest checkpoint, which resume= and export take."""
    for root in (path / CHECKPOINTS, path):
        steps = list_checkpoints(root)
        if steps:
            return f"it holds checkpoints and is not one: give {steps[-1][1]}, the newest of them"
    return "it is not a complete parabench checkpoint"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first (set-aside and partial ones excluded)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def refuse_earlier_run(root: Path, will_write: bool) -> None:
    """For a run that starts at step 0 (no resume=, or resume=auto with no checkpoint to resume),
    whose checkpoints go to `root` (`<out_dir>/checkpoints`): a CheckpointError where it would
    write over an earlier run's results in its out_dir. Rank 0 asks it in the run
    (CheckpointManager.find); a run started without a launcher asks it before any process, too.

    A finished run (its summary.json) would have its metrics.jsonl and summary.json written over,
    and its checkpoints left beside results they no longer match; checkpoints alone (`will_write`:
    this run writes its own) would be mixed with this run's. A run killed midway has no summary:
    started again in its folder (torchrun restarting the job) it is the same run, run afresh. The
    compare's runs are no fresh runs into a finished one either: the compare removes a run's
    summary.json before it starts the run again, and continues one with resume=auto; the batch
    search's probes train into folders of their own, outside `train`."""
    existing = list_checkpoints(root)
    if (root.parent / SUMMARY).is_file():
        held = f"checkpoints up to {existing[-1][1].name}" if existing else "no checkpoint to continue from"
        how = "continue it with resume=auto and more steps=, " if existing else ""
        raise CheckpointError(
            f"{root.parent} already holds a finished run ({SUMMARY}, {held}): give a fresh out_dir, "
            f"{how}or remove the folder to run there again"
        )
    if existing and will_write:
        raise CheckpointError(
            f"{root} already holds checkpoints of an earlier run ({existing[-1][1].name}): "
            "continue it with resume=auto, or give a fresh out_dir"
        )


def check_resume(resume: str | None) -> None:
    """`resume=` as the run will read it: auto, or a checkpoint folder that is there (verified when
    the run loads it); checked before any process starts."""
    if resume is None or resume == "auto":
        return
    if str(resume).strip().lower() == "never":  # compare's word for running again: train has no such mode
        raise CheckpointError(
            "resume=never is compare's: a train run starts afresh without resume= (in an out_dir that holds no "
            "earlier run's checkpoints), and continues one with resume=auto or a checkpoint folder"
        )
    if str(resume).strip().lower() in BOOLEAN_WORDS:
        raise CheckpointError(
            f"resume={resume}: give resume=auto (the newest intact checkpoint under out_dir) or a checkpoint folder "
            "such as runs/x/checkpoints/step_20"
        )
    if not Path(resume).exists():
        raise _missing(Path(resume))


def _missing(path: Path) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} does not exist: give a directory such as runs/x/checkpoints/step_20")


def verify(path: Path) -> Manifest:
    """The manifest of the checkpoint at `path` once every file it lists matches; else CheckpointError."""
    if path.is_file():  # a run's summary.json, a checkpoint's manifest.json or model.pt
        raise CheckpointError(
            f"{path} is a file, not a checkpoint folder (runs/x/checkpoints/step_N): give the step_N folder itself"
        )
    if not path.is_dir():
        raise _missing(path)
    manifest = Manifest.read(path)
    for rel, expected in manifest.files.items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: {rel} is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"checkpoint {path} is damaged: {rel} is {size} bytes, the manifest says {expected['bytes']}"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path} is damaged: {rel} does not match its sha256 in the manifest")
    unlisted = sorted(set(_relative_files(path)) - set(manifest.files) - {MANIFEST})
    if unlisted:
        raise CheckpointError(f"checkpoint {path} does not match its manifest: {unlisted[0]} is not listed in it")
    return manifest


def param_shapes(model: nn.Module) -> dict[str, list[int]]:
    """Parameter names and shapes of a bare (not yet wrapped) model: what a checkpoint must fit."""
    return {name: list(t.shape) for name, t in model.state_dict().items()}


def check_fits(manifest: Manifest, shapes: dict[str, list[int]], path: Path) -> None:
    """Refuse a checkpoint of another model before any backend tries to load it."""
    saved = manifest.param_shapes
    model = manifest.config.get("model")
    hint = (
        f"resume with the model it was trained with (model={model}, model_kwargs={manifest.config.get('model_kwargs')})"
    )
    for name in [*saved, *(n for n in shapes if n not in saved)]:  # the model's order: names the first layer
        if name not in shapes:
            raise CheckpointError(f"checkpoint {path} holds {name}, which this model lacks: {hint}")
        if name not in saved:
            raise CheckpointError(f"checkpoint {path} lacks {name}, which this model has: {hint}")
        if saved[name] != shapes[name]:
            raise CheckpointError(
                f"checkpoint {path} holds {name} of shape {saved[name]}, this model's is {shapes[name]}: {hint}"
            )


@contextlib.contextmanager
def reading(path: Path, fix: str = ANOTHER) -> Iterator[None]:
    """Reads of the checkpoint at `path` inside: a file that cannot be read is a one-line
    CheckpointError naming it, and saying `fix`. The manifest's sha256 only says a file is the one written: one
    written damaged, or replaced together with its manifest entry, fails in the backend's reader.
    Only read errors are turned into this one; any other error (a failed collective, a bug) is no
    sign of damage and leaves as it came."""
    try:
        yield
    except BaseException as exc:  # DCP's CheckpointException derives from BaseException
        damage = _damage(path, exc)
        if damage is None:
            raise
        raise _damaged(path, [damage], fix) from None


def _damage(path: Path, exc: BaseException) -> tuple[str, str] | None:
    """(the file as the manifest names it, why it cannot be read) where `exc` is a read error of
    the checkpoint at `path`; None where it is none."""
    failure = _read_failure(exc)
    if failure is None:
        return None
    error, file = failure
    return (_inside(path, file) if file is not None else f"a file of {STATE_DIR}/"), _reason(error)


def _damaged(path: Path, damage: list[tuple[str, str]], fix: str = ANOTHER) -> CheckpointError:
    """One line naming every unreadable file of `damage` and each distinct reason."""
    files = ", ".join(file for file, _ in damage)
    reasons = "; ".join(dict.fromkeys(reason for _, reason in damage))
    return CheckpointError(f"checkpoint {path} is damaged: {files} cannot be read ({reasons}): {fix}")


def _read_failure(exc: BaseException) -> tuple[BaseException, Path | None] | None:
    """The read error behind `exc` and the file it read (None: unknown), where `exc` is one: an
    unpickler's error, a cut file's EOFError, the file system's OSError, or a RuntimeError from
    within torch.load (a damaged zip archive). DCP gathers each rank's error into one
    CheckpointException (imported only where DCP was: its import takes seconds)."""
    api = sys.modules.get("torch.distributed.checkpoint.api")
    if api is not None and isinstance(exc, api.CheckpointException):
        failures = list(exc.failures.values())
        if failures and all(_is_read_error(e, [f.filename for f in trace or []]) for e, trace in failures):
            return failures[0][0], _file_of(failures[0][0])
        return None
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    if not _is_read_error(exc, [frame.f_code.co_filename for frame in frames]):
        return None
    # torch.load's errors do not name the file it read; its frame does (its argument `f`).
    loads = [frame.f_locals.get("f") for frame in frames if _is_torch_load(frame.f_code)]
    named = next((Path(f) for f in reversed(loads) if isinstance(f, (str, os.PathLike))), None)
    return exc, named or _file_of(exc)


def _is_read_error(exc: BaseException, filenames: list[str]) -> bool:
    if isinstance(exc, (pickle.UnpicklingError, EOFError, OSError)):
        return True
    # A RuntimeError elsewhere is a failed collective, or memory run out, not a damaged file.
    return isinstance(exc, RuntimeError) and torch.serialization.__file__ in filenames


def _is_torch_load(code: CodeType) -> bool:
    return code.co_filename == torch.serialization.__file__ and code.co_name == "load"


def _file_of(exc: BaseException) -> Path | None:
    filename = exc.filename if isinstance(exc, OSError) else None
    return Path(filename) if isinstance(filename, (str, os.PathLike)) else None


def _inside(path: Path, file: Path) -> str:
    """`file` as the manifest names it (state/model.pt), where it lies inside the checkpoint."""
    try:
        return str(file.resolve().relative_to(path.resolve()))
    except ValueError:
        return str(file)


def _reason(exc: BaseException) -> str:
    # torch.load's weights-only refusal runs to a paragraph: its first sentence says it.
    lines = str(exc).strip().splitlines()
    text = lines[0].split(". ")[0].rstrip(".") if lines else ""
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class CheckpointManager:
    """Writes, finds, restores and rotates the checkpoints under `root` (`<out_dir>/checkpoints`)."""

    def __init__(self, root: Path, rank: int, world_size: int, keep_last: int, printer: Callable[[str], None] = print):
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.keep_last = keep_last
        self.printer = printer  # rank 0's messages

    # ---- choosing where to start -------------------------------------------------------

    def find(self, resume: str | None, will_write: bool) -> tuple[Path, Manifest] | None:
        """Collective: the checkpoint to resume from (None: start at step 0).

        `auto`: the newest intact one under `root`; damaged ones are set aside (renamed,
        never deleted) with a line each. A path: that checkpoint, or a one-line error.
        """
        chosen = self._rank0_decides(lambda: self._choose(resume, will_write))
        if chosen is None:
            return None
        path, manifest = chosen
        return Path(path), Manifest(**manifest)

    def _choose(self, resume: str | None, will_write: bool) -> tuple[str, dict] | None:
        self._remove_partial()
        existing = list_checkpoints(self.root)
        if resume is None:
            refuse_earlier_run(self.root, will_write)
            return None
        if resume == "auto":
            return self._newest_intact(existing)
        path = Path(resume)
        manifest = verify(path)
        self._make_way_for(path, manifest.step, existing)
        return str(path), asdict(manifest)

    def _newest_intact(self, existing: list[tuple[int, Path]]) -> tuple[str, dict] | None:
        damaged: list[tuple[Path, str]] = []
        for _, path in reversed(existing):
            try:
                manifest = verify(path)
            except CheckpointError as exc:
                damaged.append((path, str(exc)))
                continue
            for bad, reason in damaged:
                aside = _set_aside(bad, "damaged")
                self.printer(f"parabench: warning: {reason}; set aside as {aside.name}, resuming from {path.name}")
            return str(path), asdict(manifest)
        if damaged:
            raise CheckpointError(
                f"no intact checkpoint under {self.root}: {damaged[0][1]} (and {len(damaged) - 1} more): "
                "repair or remove them, or give a fresh out_dir"
            )
        refuse_earlier_run(self.root, will_write=False)  # a finished run without checkpoints: not run over
        self.printer(f"no checkpoint under {self.root} yet: starting at step 0")
        return None

    def _make_way_for(self, path: Path, step: int, existing: list[tuple[int, Path]]) -> None:
        # Resuming an earlier checkpoint of this run rewrites its later steps: the later
        # checkpoints are set aside, not overwritten, so that rotation sees one history.
        if path.resolve().parent == self.root.resolve():
            for later_step, later in existing:
                if later_step > step:
                    aside = _set_aside(later, "superseded")
                    self.printer(f"parabench: note: {later.name} is later than {path.name}: set aside as {aside.name}")
        elif existing:
            raise CheckpointError(
                f"{self.root} already holds checkpoints of another run ({existing[-1][1].name}): "
                f"to continue from {path}, give a fresh out_dir"
            )
        elif (self.root.parent / SUMMARY).is_file():  # its metrics.jsonl and summary.json would be written over
            raise CheckpointError(
                f"{self.root.parent} already holds another run, finished ({SUMMARY}): "
                f"to continue from {path}, give a fresh out_dir"
            )

    # ---- restoring ---------------------------------------------------------------------

    def restore(
        self,
        path: Path,
        manifest: Manifest,
        strategy: Strategy,
        shapes: dict[str, list[int]],
        bare_model: Callable[[], nn.Module],
        config: dict[str, Any],
    ) -> str:
        """Collective: load the checkpoint into the set-up `strategy` and this rank's generators.

        The same format loads natively (model, optimizer, scaler); another format gives the
        consolidated weights only. Returns a line saying what was carried over.
        """
        check_fits(manifest, shapes, path)
        self._rank0_decides(lambda: self._check_generators(path))
        state = path / STATE_DIR
        if manifest.checkpoint_format == strategy.checkpoint_format:
            if manifest.world_size != self.world_size and not strategy.checkpoint_reshards:
                raise CheckpointError(
                    f"checkpoint {path} was saved by {manifest.world_size} ranks and {strategy.name} cannot reshard "
                    f"it to {self.world_size}: resume with nproc={manifest.world_size}, or under a strategy of "
                    "another checkpoint format to carry the weights over"
                )
            with reading(path):
                strategy.load(state)
            carried = "model and optimizer state (and the gradient scaler's, where used)"
        else:
            source = default_registry().get(manifest.strategy)
            if source.cls is None or source.unavailable_reason:
                raise CheckpointError(
                    f"checkpoint {path} was written by {manifest.strategy}, unavailable here: "
                    f"{source.unavailable_reason}"
                )
            with reading(path):
                weights = source.cls.read_full_state_dict(state, bare_model())
            strategy.load_full_state_dict(weights)
            carried = (
                f"weights only: {manifest.strategy}'s {manifest.checkpoint_format!r} checkpoint holds no optimizer "
                f"state {strategy.name} can read ({strategy.checkpoint_format!r}), so the optimizer starts afresh"
            )
        # Generators last: reading the checkpoint must not leave draws behind.
        rng_file = path / RNG_DIR / f"rank_{self.rank}.pt"
        if rng_file.is_file():
            with reading(path):
                rng.load(rng_file)
        else:
            carried += f"; rank {self.rank} had no generator state saved, so its generators keep the run's seed"
        changed = sorted(k for k in config if _changes_numbers(k, config, manifest.config))
        if changed:
            carried += "; this run changes " + ", ".join(
                f"{k}={config[k]} (was {manifest.config.get(k)})" for k in changed
            )
        return (
            f"resumed at step {manifest.step} from {path} ({manifest.strategy} on {manifest.world_size} "
            f"rank{'s' if manifest.world_size > 1 else ''}): {carried}"
        )

    def _check_generators(self, path: Path) -> None:
        """Every rank's generator file of `path`, read here by rank 0 before any rank loads: damaged
        ones are one line naming them all, not a line from each rank naming its own."""
        damage = []
        for rank in range(self.world_size):
            file = path / RNG_DIR / f"rank_{rank}.pt"
            if not file.is_file():  # a rank the checkpoint had not: restore says it keeps its seed
                continue
            try:
                rng.read(file)
            except Exception as exc:
                found = _damage(path, exc)
                if found is None:
                    raise
                damage.append(found)
        if damage:
            raise _damaged(path, damage)

    # ---- writing -----------------------------------------------------------------------

    def save(self, step: int, strategy: Strategy, config: dict[str, Any], shapes: dict[str, list[int]]) -> Path:
        """Collective: write checkpoint `step_<step>`, then drop all but the newest `keep_last`."""
        final = self.root / f"step_{step}"
        partial = self.root / f".tmp-step_{step}"
        self._rank0_decides(lambda: _make_empty(partial))
        error = None
        try:
            strategy.save(partial / STATE_DIR)
            rng.save(partial / RNG_DIR / f"rank_{self.rank}.pt")
        except OSError as exc:  # a full or read-only disk: say so on every rank, keep the old checkpoints
            error = f"rank {self.rank}: {exc}"
        errors = [e for e in _all_gather(error) if e]
        if errors:
            if self.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointError(
                f"could not write checkpoint {final} ({errors[0]}); the earlier checkpoints are intact"
            )
        manifest = Manifest(
            step=step,
            strategy=strategy.name,
            checkpoint_format=strategy.checkpoint_format,
            world_size=self.world_size,
            config=config,
            param_shapes=shapes,
            files={},
        )
        self._rank0_decides(lambda: self._seal(partial, final, manifest))
        return final

    def _seal(self, partial: Path, final: Path, manifest: Manifest) -> None:
        files = {
            rel: {"bytes": (partial / rel).stat().st_size, "sha256": _sha256(partial / rel, fsync=True)}
            for rel in _relative_files(partial)
        }
        Manifest(**{**asdict(manifest), "files": files}).write(partial)
        for directory in sorted((p for p in partial.rglob("*") if p.is_dir()), reverse=True) + [partial]:
            _fsync_dir(directory)
        os.rename(partial, final)
        _fsync_dir(self.root)
        self._rotate(keep=final)

    def _rotate(self, keep: Path) -> None:
        # The checkpoint just sealed is the newest and intact: it always survives, so
        # rotation can never leave the run without a good checkpoint.
        existing = [p for _, p in list_checkpoints(self.root)]
        for old in existing[: max(0, len(existing) - self.keep_last)]:
            if old != keep:
                # Renamed first, so that a crash mid-delete leaves no half checkpoint behind a valid name.
                doomed = old.with_name(f".deleting-{old.name}")
                os.rename(old, doomed)
                shutil.rmtree(doomed)

    def _remove_partial(self) -> None:
        # Left by a run killed while writing or deleting: never complete, never to be used.
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(_PARTIAL_PREFIXES):
                    shutil.rmtree(p, ignore_errors=True)

    # ---- agreement between ranks ---------------------------------------------------------

    def _rank0_decides(self, decide: Callable[[], T]) -> T:
        """Run `decide` on rank 0 and hand its result, or its error, to every rank."""
        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", decide())
            except CheckpointError as exc:
                box[0] = ("error", str(exc))
            except OSError as exc:
                box[0] = ("error", f"checkpoint directory {self.root}: {exc}")
        if dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise CheckpointError(value)
        return value


def _all_gather(value: Any) -> list[Any]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _make_empty(partial: Path) -> None:
    if partial.exists():
        shutil.rmtree(partial)
    (partial / STATE_DIR).mkdir(parents=True)
    (partial / RNG_DIR).mkdir()


def _set_aside(path: Path, why: str) -> Path:
    aside = path.with_name(f"{path.name}.{why}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{why}-{n}")
    os.rename(path, aside)
    return aside


def _relative_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _sha256(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
        if fsync:
            os.fsync(f.fileno())  # whichever rank wrote it, it is on the disk before the rename
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
