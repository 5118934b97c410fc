"""`python tests/forked_torchrun.py [--backends] <nproc>[,<nproc>...] <worker.py> [args...]`: torchrun's
standalone launch of one of the tests' worker scripts, as `python -m torch.distributed.run --standalone
--nproc_per_node=<nproc> <worker.py> [args...]` starts it, but with each rank forked from this
process once torch, dynamo and the script's own imports are loaded here: a new interpreter per
rank would import them again in each (seconds a rank on a busy core), and what the workers
measure does not depend on how they were started. Several process counts: one launch after
another, each of that many ranks, from this one process and its one set of imports. How
parabench itself starts its workers is tests/train/test_launch.py's to check, not these
scripts'. With --backends, the libraries of every registered strategy (DeepSpeed, Accelerate)
are imported here too, for workers that set many up; with --backends=<name>[,<name>...], those of
the strategies named only.

A rank not in its process group JOIN_WITHIN_S after its start (`--join-within=<s>` for another
bound) writes its stacks and ends (harness/train/join_watch.py): a fork can leave a rank blocked on
a lock a thread of the agent held, and its peers would wait for it for their whole process-group
timeout. Such a launch formed no process group, so it did no work: it is launched again, once.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import sys

from harness.train.launch import (
    EVERY_WORKER_IMPORTS,
    JOIN_WITHIN_S,
    launch_forked_until_formed,
    start_as_a_fresh_worker,
)

JOIN_WITHIN = "--join-within="
BACKENDS = "--backends"


def _worker(script: str, *args: str) -> None:
    """One rank: started as a fresh worker would be, then the script as __main__."""
    start_as_a_fresh_worker()
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    argv = sys.argv[1:]
    join_within_s = float(argv.pop(0).removeprefix(JOIN_WITHIN)) if argv[0].startswith(JOIN_WITHIN) else JOIN_WITHIN_S
    backends = argv.pop(0) if argv[0].partition("=")[0] == BACKENDS else None
    nprocs, script, *args = argv
    script = os.path.abspath(script)
    sys.path[0] = os.path.dirname(script)  # as `python <script>` has it
    for name in EVERY_WORKER_IMPORTS:  # what every rank imports, once here, as the runner's launcher does
        importlib.import_module(name)
    # The script's own imports, once here: its body runs again, as __main__, in each rank.
    spec = importlib.util.spec_from_file_location("_forked_torchrun_preload", script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    if backends is not None:
        from strategies.backend_imports import import_backends
        from strategies.registry import default_registry

        # As the runner's launcher does before it forks CPU workers: DeepSpeed need not look for a device.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        names = backends.partition("=")[2].split(",") if "=" in backends else default_registry().names()
        entries = [default_registry().get(name) for name in names]
        import_backends({m for e in entries if e.unavailable_reason is None for m in e.cls.backend_modules})
    for nproc in nprocs.split(","):
        launch = ["--standalone", f"--nproc_per_node={nproc}", script, *args]
        launch_forked_until_formed(launch, _worker, [script, *args], join_within_s, "forked_torchrun")


if __name__ == "__main__":
    main()
