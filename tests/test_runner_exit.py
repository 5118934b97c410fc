"""`runner.py` run as a command leaves its objects uncollected when it exits: the interpreter's last
collections over what torch made would hold every run, compare and launcher a second or two."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, env_for_tests

# runner.py as its command line runs it, with a handler that reports, as the process exits, how many
# objects the final collections will pass over (atexit handlers run after the command returned).
AS_A_COMMAND = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("frozen objects:", gc.get_freeze_count()))
sys.argv = ["runner.py", *sys.argv[1:]]
runpy.run_path("runner.py", run_name="__main__")
"""


@pytest.mark.parametrize("args, code", [(["list"], 0), (["no-such-command"], 2)])
def test_the_command_freezes_what_it_made_before_the_interpreter_exits(args, code):
    proc = subprocess.run(
        [sys.executable, "-c", AS_A_COMMAND, *args],
        cwd=ROOT,
        env=env_for_tests(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    frozen = int(proc.stdout.rsplit("frozen objects:", 1)[1])
    assert frozen > 0
