"""profile_steps= (harness/train/profiling.py): what a trace says a step costs, and the traces
`runner.py train` and the hand-written loops write for bench/profile_step.py."""

from __future__ import annotations

import json
import sys

import pytest

from configs.schema import ConfigError, load_config
from harness.train.profiling import STEP_MARK, collective_kind, summarize
from tests.helpers import NANO, ROOT, env_for_tests, run_bounded, run_cli


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_summary_counts_each_collective_call_once_and_host_time_outside_ops_and_communication():
    trace = {
        "traceEvents": [
            _event(f"{STEP_MARK}3", 0, 10_000, cat="user_annotation"),
            _event("aten::mm", 1_000, 2_000),
            _event("aten::addmm", 1_500, 500),  # nested in aten::mm: no time of its own
            _event("c10d::allreduce_", 4_000, 100),
            _event("c10d::allreduce_", 4_020, 50),  # nested in the call above: one call
            _event("gloo:all_reduce", 4_000, 1_000, cat="user_annotation", tid=9),  # in flight until 5 ms
            _event("c10d::_allgather_base_", 6_000, 1_000),
            _event("_c10d_functional::wait_tensor", 7_500, 500),  # an operator, not a collective
            _event("aten::add", 12_000, 100),  # after the step
        ]
    }
    (step,) = summarize(trace)["steps"]
    assert step["step"] == 3 and step["collectives"] == {"all_gather": 1, "all_reduce": 1}
    assert step["operators"] == 4  # mm, allreduce, allgather, wait: not the nested ones, not the one after
    # Busy: mm 1-3 ms, allreduce 4-5 ms (in flight), allgather 6-7 ms, wait 7.5-8 ms.
    assert step["wall_ms"] == 10.0 and step["backend_ms"] == pytest.approx(4.5)
    assert step["host_ms"] == pytest.approx(5.5)


@pytest.mark.parametrize(
    "op, kind",
    [
        ("c10d::allreduce_", "all_reduce"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
        ("_c10d_functional::all_reduce", "all_reduce"),
        ("c10d::broadcast_", "broadcast"),
        ("c10d::reduce_", "reduce"),
        ("_c10d_functional::wait_tensor", None),
        ("aten::mm", None),
    ],
)
def test_collective_kinds(op, kind):
    assert collective_kind(op) == kind


def test_profile_steps_must_be_consecutive_steps_of_the_run():
    assert load_config(["steps=10", "profile_steps=[4,5,6]"]).profile_steps == [4, 5, 6]
    for bad in ("[4,6]", "[0,1]", "[10,11]"):
        with pytest.raises(
            ConfigError, match="profile_steps=.* must be consecutive step numbers between 1 and steps=10"
        ):
            load_config(["steps=10", f"profile_steps={bad}"])


@pytest.mark.slow
def test_runner_and_hand_written_ddp_traces_count_the_same_collectives(tmp_path):
    runner_dir, hand_dir = tmp_path / "runner", tmp_path / "hand"
    # Steps 3 and 4: the runner's metrics flushes (two all-reduces each) are at steps 2, 5 and 10.
    proc = run_cli(["train", "strategy=ddp", "nproc=2", f"out_dir={runner_dir}", *NANO, "profile_steps=[3,4]"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    hand = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "bench" / "handwritten" / "ddp.py"),
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--model",
        "gpt-nano",
        "--steps",
        "6",
        "--warmup",
        "1",
        "--micro-batch",
        "4",
        "--seq-len",
        "32",
        "--data-samples",
        "64",
        "--profile-steps",
        "3,4",
        "--profile-dir",
        str(hand_dir),
    ]
    done = run_bounded(hand, timeout=180, env=env_for_tests(), cwd=ROOT)
    # Both ends: a rank that aborts says why early on, its peer's broken connection comes last.
    assert done.returncode == 0, done.stderr[:4000] + "\n...\n" + done.stderr[-3000:]
    for rank in (0, 1):
        runner = json.loads((runner_dir / "profile" / f"rank{rank}.summary.json").read_text())
        written = summarize(json.loads((hand_dir / f"rank{rank}.trace.json").read_text()))
        # The runner's own summary is the same function over its own trace.
        assert runner == summarize(json.loads((runner_dir / "profile" / f"rank{rank}.trace.json").read_text()))
        assert [s["step"] for s in runner["steps"]] == [s["step"] for s in written["steps"]] == [3, 4]
        # DDP of gpt-nano: one bucket, one all-reduce a step, on both sides.
        assert all(s["collectives"] == {"all_reduce": 1} for s in runner["steps"] + written["steps"])
        assert all(0 < s["host_ms"] < s["wall_ms"] for s in runner["steps"] + written["steps"])
