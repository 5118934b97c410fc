"""Checkpoints: atomic writes, verification, fallback, rotation, export, and crossing strategies.

The manager's rules are checked in-process on checkpoints of a one-step `single` run
(no process group needed at world size 1); what a user sees (exports that load strictly,
resuming under another strategy, a damaged checkpoint skipped, one-line errors) runs
the CLI on gpt-nano, ranks on CPU/gloo.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file

import runner
from harness.common.testing_hooks import FAULT_ENV
from harness.train import rng
from harness.train.checkpoint import (
    CheckpointError,
    CheckpointManager,
    Manifest,
    check_fits,
    check_resume,
    param_shapes,
    verify,
)
from harness.train.optimizer import adamw_factory
from models.data import GlobalBatchSchedule, load_data, split_inputs_targets
from models.zoo import build_model
from strategies.base import RunContext
from strategies.single import SingleDeviceStrategy
from tests.helpers import NANO, env_for_tests, made_once, run_cli

STRATEGIES = ("single", "ddp", "fsdp")
RUN_ARGS = [*NANO, "steps=20", "checkpoint_every=10"]
# Live losses average the ranks' halves of the batch, a check on one process takes the
# whole batch at once: the same weights, summed in another order (~1 ulp apart).
SUM_ORDER_RTOL = 1e-6


def launch(
    strategy: str,
    out_dir: Path,
    *extra: str,
    fault: str | None = None,
    restarts: int | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """Train as a user would: `single` as one process, the others with `nproc=2` (on the CPU, two
    workers forked by the launcher); with `restarts`, under the torchrun command whatever the
    strategy, each rank a new interpreter. Forked workers pay the imports once, in the launcher,
    where new interpreters pay them in each rank; tests/train/test_launch.py holds the two kinds
    of worker to the same curve."""
    env = env_for_tests(**({FAULT_ENV: fault} if fault else {}))
    args = ["train", f"strategy={strategy}", f"out_dir={out_dir}", *RUN_ARGS, *extra]
    if restarts is None:
        return run_cli(args if strategy == "single" else [*args, "nproc=2"], env=env, timeout=timeout)
    nproc = 1 if strategy == "single" else 2
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    if restarts is not None:
        torchrun.append(f"--max-restarts={restarts}")
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see harness.train.distributed.restart_hazard
    return run_cli(args, env=env, timeout=timeout, prefix=torchrun)


def log(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def losses(out_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step is logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


@functools.cache
def straight_run(strategy: str, base: Path) -> Path:
    """20 uninterrupted steps, checkpoints at 10 and 20: the curve every resume must reproduce
    (trained once per session, shared with test_faults whichever xdist worker runs it)."""

    def make(out: Path) -> None:
        proc = launch(strategy, out)
        assert proc.returncode == 0, log(proc)

    return made_once(base, f"straight-{strategy}", make)


@pytest.fixture(scope="module", params=STRATEGIES)
def straight(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, straight_run(request.param, tmp_path_factory.getbasetemp())


# ---- the manager's rules, in-process ------------------------------------------------------


def _trained_single() -> tuple[SingleDeviceStrategy, dict]:
    torch.manual_seed(0)
    model = build_model("gpt-nano")
    shapes = param_shapes(model)
    ctx = RunContext(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=2,
        grad_accum=1,
        grad_clip=1.0,
    )
    strategy = SingleDeviceStrategy(ctx)
    strategy.name = "single"
    strategy.setup(model, adamw_factory(1e-3, (0.9, 0.95), 0.1))
    tokens = torch.randint(0, 128, (2, 9))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    strategy.step()
    return strategy, shapes


CONFIG = {"model": "gpt-nano", "model_kwargs": {}, "lr": 1e-3}


@pytest.fixture
def three_checkpoints(tmp_path) -> tuple[CheckpointManager, SingleDeviceStrategy, dict, list[str]]:
    """Checkpoints at steps 1, 2 and 3 under keep_last=2: step_1 rotated away."""
    strategy, shapes = _trained_single()
    messages: list[str] = []
    manager = CheckpointManager(tmp_path / "checkpoints", rank=0, world_size=1, keep_last=2, printer=messages.append)
    for step in (1, 2, 3):
        manager.save(step, strategy, CONFIG, shapes)
    return manager, strategy, shapes, messages


def test_checkpoints_are_complete_verified_and_rotated(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    assert sorted(p.name for p in manager.root.iterdir()) == ["step_2", "step_3"]  # no partial leftovers
    manifest = verify(manager.root / "step_3")
    assert (manifest.step, manifest.strategy, manifest.checkpoint_format, manifest.world_size) == (
        3,
        "single",
        "torch",
        1,
    )
    assert set(manifest.files) == {"state/model.pt", "state/optimizer.pt", "rng/rank_0.pt"}
    saved = torch.load(manager.root / "step_3" / "state" / "model.pt", weights_only=True)
    assert set(saved) == set(build_model("gpt-nano").state_dict())  # plain names, every key


def _truncate(ckpt: Path) -> None:
    file = ckpt / "state" / "model.pt"
    file.write_bytes(file.read_bytes()[:100])


def _wrong_checksum(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["state/optimizer.pt"]["sha256"] = "0" * 64
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _unlisted_file(ckpt: Path) -> None:
    (ckpt / "state" / "stray.pt").write_bytes(b"not in the manifest")


def _no_manifest(ckpt: Path) -> None:
    (ckpt / "manifest.json").unlink()


@pytest.mark.parametrize("damage", [_truncate, _wrong_checksum, _unlisted_file, _no_manifest])
def test_auto_resume_sets_a_damaged_checkpoint_aside_and_uses_the_previous(three_checkpoints, damage):
    manager, _, _, messages = three_checkpoints
    newest = manager.root / "step_3"
    damage(newest)
    damaged_bytes = {p.name: p.read_bytes() for p in newest.rglob("*") if p.is_file()}
    path, manifest = manager.find("auto", will_write=True)
    assert (path.name, manifest.step) == ("step_2", 2)
    assert len(messages) == 1 and "\n" not in messages[0] and "step_3" in messages[0], messages
    aside = manager.root / "step_3.damaged"
    assert {p.name: p.read_bytes() for p in aside.rglob("*") if p.is_file()} == damaged_bytes  # kept, not lost


def test_a_named_damaged_checkpoint_is_an_error_not_a_fallback(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    _truncate(manager.root / "step_3")
    with pytest.raises(CheckpointError, match="step_3 is damaged: state/model.pt is 100 bytes") as err:
        manager.find(str(manager.root / "step_3"), will_write=True)
    assert "\n" not in str(err.value)
    assert (manager.root / "step_3").is_dir()


def test_a_file_given_as_the_checkpoint_says_so(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    file = manager.root / "step_3" / "state" / "model.pt"
    with pytest.raises(CheckpointError, match="model.pt is a file, not a checkpoint folder") as err:
        manager.find(str(file), will_write=True)
    assert "\n" not in str(err.value) and "does not exist" not in str(err.value)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    _truncate(manager.root / "step_3")
    _wrong_checksum(manager.root / "step_2")
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        manager.find("auto", will_write=True)
    assert sorted(p.name for p in manager.root.iterdir()) == ["step_2", "step_3"]


def test_a_fresh_run_will_not_write_over_an_earlier_runs_checkpoints(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    with pytest.raises(CheckpointError, match="resume=auto"):
        manager.find(None, will_write=True)
    assert manager.find(None, will_write=False) is None


def test_a_fresh_run_will_not_write_over_a_finished_runs_results(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    summary = manager.root.parent / "summary.json"
    summary.write_text("{}")
    with pytest.raises(
        CheckpointError, match="already holds a finished run .summary.json, checkpoints up to step_3."
    ) as err:
        manager.find(None, will_write=False)  # without checkpointing too: its metrics and summary are written over
    assert "\n" not in str(err.value) and "resume=auto" in str(err.value)
    assert manager.find("auto", will_write=True)[0].name == "step_3"  # continuing it is no fresh run
    assert summary.read_text() == "{}"


def test_a_finished_run_without_checkpoints_is_never_run_over(tmp_path):
    """No resume=, or resume=auto with nothing to resume, or another run's checkpoint: each would
    start over a finished run's metrics.jsonl and summary.json."""
    manager = CheckpointManager(tmp_path / "checkpoints", rank=0, world_size=1, keep_last=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert manager.find(None, will_write=False) is None  # killed midway, restarted in its folder: the same run
    (tmp_path / "summary.json").write_text("{}")
    for resume in (None, "auto"):
        with pytest.raises(CheckpointError, match="finished run .summary.json, no checkpoint to continue from.") as err:
            manager.find(resume, will_write=False)
        assert "resume=auto" not in str(err.value) and "give a fresh out_dir" in str(err.value)
    strategy, shapes = _trained_single()
    other = CheckpointManager(tmp_path / "other" / "checkpoints", rank=0, world_size=1, keep_last=2)
    with pytest.raises(CheckpointError, match="already holds another run, finished"):
        manager.find(str(other.save(1, strategy, CONFIG, shapes)), will_write=False)
    assert (tmp_path / "summary.json").read_text() == "{}"


def test_resuming_an_earlier_step_sets_the_later_ones_aside(three_checkpoints):
    manager, strategy, shapes, _ = three_checkpoints
    path, _ = manager.find(str(manager.root / "step_2"), will_write=True)
    assert path.name == "step_2"
    assert sorted(p.name for p in manager.root.iterdir()) == ["step_2", "step_3.superseded"]
    manager.save(3, strategy, CONFIG, shapes)  # the redone step 3 has its name free
    verify(manager.root / "step_3")


def test_a_partial_checkpoint_is_never_used_and_is_cleared(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    partial = manager.root / ".tmp-step_4"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "model.pt").write_bytes(b"half")
    path, _ = manager.find("auto", will_write=True)
    assert path.name == "step_3" and not partial.exists()


def test_restore_brings_back_model_optimizer_and_generators(three_checkpoints):
    manager, strategy, shapes, _ = three_checkpoints
    path, manifest = manager.find("auto", will_write=True)
    saved_weights = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    saved_moments = [s["exp_avg"].clone() for s in strategy.optimizer.state.values()]
    rng.load(path / "rng" / "rank_0.pt")
    expected_draw = torch.rand(3)  # the first draw after the checkpoint
    tokens = torch.randint(0, 128, (2, 9))
    strategy.model(tokens[:, :-1], tokens[:, 1:]).backward()
    strategy.step()  # move weights, moments and generators away from the checkpoint
    assert not torch.equal(torch.rand(3), expected_draw)
    manager.restore(path, manifest, strategy, shapes, bare_model=lambda: build_model("gpt-nano"), config=CONFIG)
    assert torch.equal(torch.rand(3), expected_draw)
    for name, value in strategy.model.state_dict().items():
        assert torch.equal(value, saved_weights[name]), name
    moments = zip(strategy.optimizer.state.values(), saved_moments, strict=True)
    assert all(torch.equal(s["exp_avg"], m) for s, m in moments)


def test_a_checkpoint_of_another_model_shape_is_refused(three_checkpoints):
    manager, _, _, _ = three_checkpoints
    manifest = verify(manager.root / "step_3")
    with pytest.raises(CheckpointError, match=r"wte.weight of shape \[128, 64\].*model=gpt-nano") as err:
        check_fits(manifest, param_shapes(build_model("gpt-nano", {"n_embd": 32})), manager.root / "step_3")
    assert "\n" not in str(err.value)


def test_a_world_size_change_is_refused_where_the_backend_cannot_reshard(three_checkpoints):
    manager, strategy, shapes, _ = three_checkpoints

    class NoReshard(SingleDeviceStrategy):
        checkpoint_reshards = False

    fixed = NoReshard(strategy.ctx)
    fixed.name = "no-reshard"
    fixed.setup(build_model("gpt-nano"), adamw_factory(1e-3, (0.9, 0.95), 0.1))
    path = manager.root / "step_3"
    four_ranks = CheckpointManager(manager.root, rank=0, world_size=4, keep_last=2)
    with pytest.raises(
        CheckpointError, match="saved by 1 ranks and no-reshard cannot reshard it to 4: resume with nproc=1"
    ):
        four_ranks.restore(path, verify(path), fixed, shapes, bare_model=lambda: build_model("gpt-nano"), config=CONFIG)
    verify(path)  # untouched


def _replaced_with_its_checksum(ckpt: Path, rel: str, damage: Callable[[bytes], bytes]) -> None:
    """`rel` damaged and its manifest entry rewritten to match: damage only reading the file finds."""
    data = damage((ckpt / rel).read_bytes())
    (ckpt / rel).write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _random_bytes(data: bytes) -> bytes:
    return random.Random(0).randbytes(len(data))


@pytest.mark.parametrize(
    "rel, damage, error",
    [
        ("state/model.pt", _random_bytes, "UnpicklingError: Weights only load failed"),
        ("state/model.pt", lambda data: data[: len(data) // 2], "RuntimeError: PytorchStreamReader failed"),
        ("state/model.pt", lambda data: b"", "EOFError"),
        ("state/optimizer.pt", _random_bytes, "UnpicklingError"),
        ("rng/rank_0.pt", _random_bytes, "UnpicklingError"),
    ],
    ids=["model-random", "model-cut", "model-empty", "optimizer", "generators"],
)
def test_a_file_that_cannot_be_read_though_its_checksum_matches_is_one_line(three_checkpoints, rel, damage, error):
    manager, strategy, shapes, _ = three_checkpoints
    ckpt = manager.root / "step_3"
    _replaced_with_its_checksum(ckpt, rel, damage)
    path, manifest = manager.find(str(ckpt), will_write=True)  # its checksums match
    expected = f"checkpoint {ckpt} is damaged: {rel} cannot be read ({error}"
    with pytest.raises(CheckpointError, match=re.escape(expected)) as err:
        manager.restore(path, manifest, strategy, shapes, bare_model=lambda: build_model("gpt-nano"), config=CONFIG)
    assert "\n" not in str(err.value) and str(err.value).endswith("): resume from another checkpoint")


def test_every_ranks_damaged_generators_are_one_line_naming_them_all(three_checkpoints):
    """Rank 0 reads every rank's generator file before any rank loads: two damaged files are one
    line naming both, not a line from each rank (one rank's manager here; no process group)."""
    manager, strategy, shapes, _ = three_checkpoints
    ckpt = manager.root / "step_3"
    shutil.copy(ckpt / "rng" / "rank_0.pt", ckpt / "rng" / "rank_1.pt")
    for rel in ("rng/rank_0.pt", "rng/rank_1.pt"):
        _replaced_with_its_checksum(ckpt, rel, _random_bytes)
    two_ranks = CheckpointManager(manager.root, rank=0, world_size=2, keep_last=2)
    path, manifest = two_ranks.find(str(ckpt), will_write=True)  # its checksums match
    expected = f"checkpoint {ckpt} is damaged: rng/rank_0.pt, rng/rank_1.pt cannot be read (UnpicklingError: "
    with pytest.raises(CheckpointError, match=re.escape(expected)) as err:
        two_ranks.restore(path, manifest, strategy, shapes, bare_model=lambda: build_model("gpt-nano"), config=CONFIG)
    assert "\n" not in str(err.value) and str(err.value).endswith("): resume from another checkpoint")


def test_an_error_that_is_no_damage_is_not_called_damage(three_checkpoints):
    """Only read errors are a damaged checkpoint: a RuntimeError outside torch.load (a collective
    that failed, memory run out) is left as it came."""
    manager, strategy, shapes, _ = three_checkpoints

    class FailedCollective(SingleDeviceStrategy):
        def load(self, path: Path) -> None:
            raise RuntimeError("Connection closed by peer")

    failing = FailedCollective(strategy.ctx)
    path = manager.root / "step_3"
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        manager.restore(path, verify(path), failing, shapes, bare_model=lambda: build_model("gpt-nano"), config=CONFIG)


class _DCPWriter:
    """Writes fsdp's format (DCP) as its save() does, in one process without a process group."""

    name, checkpoint_format = "fsdp", "dcp"

    def save(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": build_model("gpt-nano").state_dict()}, checkpoint_id=path, no_dist=True)


@pytest.mark.parametrize("rel", ["state/.metadata", "state/__0_0.distcp"])
def test_an_unreadable_dcp_file_is_one_line(tmp_path, capsys, rel):
    manager = CheckpointManager(tmp_path / "checkpoints", rank=0, world_size=1, keep_last=2)
    ckpt = manager.save(1, _DCPWriter(), CONFIG, param_shapes(build_model("gpt-nano")))
    _replaced_with_its_checksum(ckpt, rel, _random_bytes)
    assert runner.main(["export", str(ckpt), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"checkpoint {ckpt} is damaged: a file of state/ cannot be read" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


_WRONG_FIELDS = {
    "step": 1,
    "strategy": "single",
    "checkpoint_format": "torch",
    "world_size": 1,
    "config": {},
    "param_shapes": {},
    "files": ["state/model.pt"],
    "format_version": 1,
}


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "manifest.json is unreadable"),
        (json.dumps({**_WRONG_FIELDS, "format_version": 99}), "not a version-1 parabench manifest"),
        (json.dumps({**_WRONG_FIELDS, "extra": 1}), "does not have the fields of a manifest"),
        (json.dumps(_WRONG_FIELDS), "does not list its files"),
    ],
)
def test_a_malformed_manifest_is_reported_in_one_line(tmp_path, text, message):
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError, match=message) as err:
        Manifest.read(tmp_path / "step_1")
    assert "\n" not in str(err.value)


# ---- export --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["only-one-arg"], "export takes a checkpoint and an output file"),
        (["{ckpt}", "{tmp}/out.bin"], "should end in .safetensors"),
        (["{ckpt}", "{tmp}/exists.safetensors"], "already exists"),
        (["{tmp}/nowhere", "{tmp}/out.safetensors"], "does not exist"),
        (["{damaged}", "{tmp}/out.safetensors"], "is damaged"),
        (["{unreadable}", "{tmp}/out.safetensors"], "step_1 is damaged: state/model.pt cannot be read (Unpickling"),
        (["{ckpt}/manifest.json", "{tmp}/out.safetensors"], "manifest.json is a file, not a checkpoint folder"),
        (["{ckpt}", "/proc/out.safetensors"], "output directory /proc cannot be written"),
    ],
)
def test_export_errors_are_one_line(three_checkpoints, tmp_path, capsys, args, message):
    manager, _, _, _ = three_checkpoints
    (tmp_path / "exists.safetensors").write_bytes(b"precious")
    _truncate(manager.root / "step_2")
    unreadable = shutil.copytree(manager.root / "step_3", tmp_path / "step_1")
    _replaced_with_its_checksum(unreadable, "state/model.pt", _random_bytes)
    names = {"ckpt": manager.root / "step_3", "damaged": manager.root / "step_2", "unreadable": unreadable}
    assert runner.main(["export", *(a.format(**names, tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert (tmp_path / "exists.safetensors").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "exists.safetensors", "step_1"]


def test_an_export_that_cannot_be_written_is_one_line_and_leaves_nothing(
    three_checkpoints, tmp_path, capsys, monkeypatch
):
    from safetensors import SafetensorError

    def disk_full(weights: dict, filename: str, metadata: dict) -> None:
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    manager, _, _, _ = three_checkpoints
    target = tmp_path / "out" / "model.safetensors"
    target.parent.mkdir()
    monkeypatch.setattr("harness.train.export_cli.save_file", disk_full)
    assert runner.main(["export", str(manager.root / "step_3"), str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"could not write {target} (" in err and "No space left" in err, err
    assert list(target.parent.iterdir()) == []  # no partial file left behind


def test_a_strategy_without_checkpoints_is_refused_up_front(three_checkpoints):
    from configs.schema import RunConfig
    from harness.train.loop import _find_checkpoint

    manager, strategy, _, _ = three_checkpoints

    class NoCheckpoints(SingleDeviceStrategy):
        checkpoint_format = ""

    with pytest.raises(ValueError, match="cannot save or load checkpoints yet"):
        _find_checkpoint(RunConfig(strategy="x", checkpoint_every=5), NoCheckpoints(strategy.ctx), manager)


# ---- end to end: export, other strategies, a damaged checkpoint ------------------------------


def _loss_on_step(weights: dict[str, torch.Tensor], step_index: int) -> float:
    """The bare model's loss on the global batch of `step_index` (0-based), as training saw it."""
    data = load_data("markov", vocab_size=128, seq_len=32, num_samples=256, seed=1337)
    rows = data.batch(GlobalBatchSchedule(len(data), 8, 1337).global_indices(step_index))
    model = build_model("gpt-nano")
    model.load_state_dict(weights, strict=True)
    with torch.no_grad():
        return model(*split_inputs_targets(rows)).item()


def test_export_loads_strictly_and_gives_the_live_models_loss(straight, tmp_path):
    strategy, out = straight
    target = tmp_path / f"{strategy}.safetensors"
    assert runner.main(["export", str(out / "checkpoints" / "step_10"), str(target)]) == 0
    weights = load_file(target)
    assert all(t.dtype == torch.float32 for t in weights.values())
    # Step 11's batch is held out from the step-10 weights; training logged their loss on it.
    live = losses(out)[11]
    assert _loss_on_step(weights, 10) == pytest.approx(live, rel=SUM_ORDER_RTOL)


def test_a_checkpoint_continues_under_another_strategy(tmp_path_factory, tmp_path):
    base = tmp_path_factory.getbasetemp()
    ddp, fsdp = straight_run("ddp", base), straight_run("fsdp", base)
    # Same format (torch), 2 ranks -> 1: model and optimizer carry over, the curve continues.
    proc = launch("single", tmp_path / "from-ddp", f"resume={ddp / 'checkpoints' / 'step_10'}")
    assert proc.returncode == 0, log(proc)
    assert "model and optimizer state" in proc.stdout
    continued, reference = losses(tmp_path / "from-ddp"), losses(ddp)
    assert sorted(continued) == list(range(11, 21))
    for step, loss in continued.items():
        assert loss == pytest.approx(reference[step], rel=SUM_ORDER_RTOL), step
    # Another format (dcp): the weights carry over, the optimizer starts afresh, and says so.
    proc = launch("single", tmp_path / "from-fsdp", f"resume={fsdp / 'checkpoints' / 'step_10'}")
    assert proc.returncode == 0, log(proc)
    assert "weights only" in proc.stdout and "optimizer starts afresh" in proc.stdout
    assert losses(tmp_path / "from-fsdp")[11] == pytest.approx(losses(fsdp)[11], rel=SUM_ORDER_RTOL)


def test_a_damaged_newest_checkpoint_falls_back_and_loses_nothing(tmp_path_factory, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(straight_run("single", tmp_path_factory.getbasetemp()), out)
    reference = losses(out)
    _truncate(out / "checkpoints" / "step_20")
    proc = launch("single", out, "resume=auto")
    assert proc.returncode == 0, log(proc)
    warnings = [line for line in proc.stdout.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "step_20 is damaged" in warnings[0] and "resuming from step_10" in warnings[0]
    assert losses(out) == reference  # steps 11-20 redone, bit for bit
    assert (out / "checkpoints" / "step_20.damaged" / "state" / "model.pt").stat().st_size == 100
    verify(out / "checkpoints" / "step_20")


def test_a_checkpoint_of_another_model_is_a_one_line_error(tmp_path_factory, tmp_path):
    source = straight_run("single", tmp_path_factory.getbasetemp()) / "checkpoints" / "step_10"
    proc = launch("single", tmp_path / "other", f"resume={source}", "model_kwargs={n_embd: 32}")
    assert proc.returncode == 2, log(proc)
    assert proc.stderr.count("\n") == 1 and "of shape [128, 64], this model's is [128, 32]" in proc.stderr, proc.stderr
    verify(source)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("step", "x", "step is 'x', not a whole number of 0 or more"),
        ("step", None, "step is None, not a whole number of 0 or more"),
        ("step", -3, "step is -3, not a whole number of 0 or more"),
        ("world_size", "two", "world_size is 'two', not a whole number of 1 or more"),
        ("strategy", 5, "strategy is 5, not a name"),
        ("config", [1], "config does not name its model"),
        ("param_shapes", {"w": "x"}, "param_shapes is not {name: [sizes]}"),
    ],
)
def test_a_manifest_field_of_the_wrong_kind_is_one_line_naming_it(tmp_path, field, value, says):
    manager = CheckpointManager(tmp_path / "checkpoints", rank=0, world_size=1, keep_last=2)
    ckpt = manager.save(1, _DCPWriter(), CONFIG, param_shapes(build_model("gpt-nano")))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest[field] = value
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as err:
        verify(ckpt)
    assert str(err.value) == f"checkpoint {ckpt} is damaged: manifest.json's {says}: resume from another checkpoint"


def test_compares_resume_never_given_to_train_says_how_train_starts_afresh():
    with pytest.raises(CheckpointError, match=r"resume=never is compare's: a train run starts afresh without resume="):
        check_resume("never")


def test_a_runs_folder_given_as_a_checkpoint_names_its_newest_checkpoint(tmp_path):
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
    newest = tmp_path / "checkpoints" / "step_4"
    for given in (tmp_path, tmp_path / "checkpoints"):
        with pytest.raises(CheckpointError, match=f"holds checkpoints and is not one: give {newest}, the newest"):
            Manifest.read(given)
    with pytest.raises(CheckpointError, match="has no manifest.json: it is not a complete parabench checkpoint"):
        Manifest.read(newest)
