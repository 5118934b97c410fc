"""Two torchrun agents on one host act as two nodes (1 process each, gloo, c10d
rendezvous on 127.0.0.1): the curves must match `single` as on one node."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness.distributed import free_port
from tests.helpers import NANO, RUNNER, env_for_tests, max_rel_diff, read_run


def _two_node_run(out_dir, strategy: str, timeout: float = 240) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
             "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id=node-test-{strategy}",
             RUNNER, "train", f"strategy={strategy}", f"out_dir={out_dir}", *NANO],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for_tests(), start_new_session=True,
        )
        for _ in range(2)
    ]
    logs = []
    try:
        for agent in agents:
            logs.append(agent.communicate(timeout=timeout)[0])
    finally:
        for agent in agents:
            agent.kill()
    for agent, log in zip(agents, logs):
        assert agent.returncode == 0, log[-3000:]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero3"])
def test_two_nodes_match_single(tmp_path, strategy, reference_run):
    _two_node_run(tmp_path, strategy)
    summary, rows = read_run(tmp_path)
    assert (summary["nodes"], summary["procs_per_node"], summary["world_size"]) == (2, 1, 2)
    assert summary["backend"] == "gloo"
    deviation = max_rel_diff(rows, reference_run[1])
    print(f"{strategy} on 2 nodes: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < 1e-4
