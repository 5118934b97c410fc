"""The build lock of DeepSpeed's CPU op: waited on while a build may hold it, cleared once stale."""

from __future__ import annotations

import os
import threading
import time

from strategies import deepspeed_cpu_op
from strategies.deepspeed_cpu_op import wait_for_build_lock


def test_no_lock_returns_at_once(tmp_path):
    started = time.monotonic()
    wait_for_build_lock(tmp_path / "lock")
    assert time.monotonic() - started < 0.5


def test_a_stale_lock_is_removed_with_a_line(tmp_path, capsys):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 2 * deepspeed_cpu_op.STALE_LOCK_S
    os.utime(lock, (old, old))
    wait_for_build_lock(lock)
    assert not lock.exists()
    assert "interrupted build" in capsys.readouterr().err


def test_a_live_build_is_waited_for_and_its_lock_left_to_it(tmp_path, monkeypatch):
    monkeypatch.setattr(deepspeed_cpu_op, "_POLL_S", 0.05)
    lock = tmp_path / "lock"
    lock.touch()
    seen_while_waiting = []

    def finish_build() -> None:
        time.sleep(0.4)
        seen_while_waiting.append(lock.exists())
        lock.unlink()

    builder = threading.Thread(target=finish_build)
    builder.start()
    wait_for_build_lock(lock)
    builder.join()
    assert seen_while_waiting == [True]  # still there when the build finished: not taken from it
