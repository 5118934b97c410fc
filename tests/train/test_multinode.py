"""Two "nodes" on one host, 1 process each over gloo, under each launcher's own
multi-node mode: torchrun's c10d rendezvous, the deepspeed launcher without ssh
(`--no_ssh --node_rank`), and accelerate launch with a machine rank. The curves
must match `single` as on one node, and the results must say 2 nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from harness.train.distributed import free_port
from tests.helpers import NANO, ROOT, RUNNER, env_for_tests, max_rel_diff, read_run

BIN = Path(sys.executable).parent
CONFIGS = ROOT / "configs" / "accelerate"


def torchrun_node(node_rank: int, port: int, tmp_path: Path, strategy: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id=node-test-{strategy}",
    ]


def deepspeed_node(node_rank: int, port: int, tmp_path: Path, strategy: str) -> list[str]:
    # The hostfile's names only order the nodes: with --no_ssh each launcher starts its own.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    return [
        str(BIN / "deepspeed"),
        "--hostfile",
        str(hostfile),
        "--no_ssh",
        f"--node_rank={node_rank}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
    ]


def accelerate_node(node_rank: int, port: int, tmp_path: Path, strategy: str) -> list[str]:
    mode = strategy.removeprefix("accelerate-")
    # "standard": torchrun on each machine, as for the other modes, not pdsh over ssh.
    return [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        str(CONFIGS / f"{mode}.yaml"),
        "--num_machines",
        "2",
        "--machine_rank",
        str(node_rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--num_processes",
        "2",
        "--deepspeed_multinode_launcher",
        "standard",
    ]


def _two_node_run(out_dir: Path, strategy: str, launcher: Callable[..., list[str]], timeout: float = 240) -> None:
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                *launcher(node_rank, port, out_dir, strategy),
                RUNNER,
                "train",
                f"strategy={strategy}",
                f"out_dir={out_dir}",
                *NANO,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env_for_tests(),
            start_new_session=True,
            cwd=out_dir,  # launchers may write into their cwd (accelerate's pdsh path: .deepspeed_env)
        )
        for node_rank in range(2)
    ]
    logs = []
    try:
        for agent in agents:
            logs.append(agent.communicate(timeout=timeout)[0])
    finally:
        for agent in agents:
            agent.kill()
    for agent, log in zip(agents, logs, strict=True):
        assert agent.returncode == 0, log[-3000:]


# Two nodes once on every change, through torchrun's rendezvous; the other strategies and the other two
# launchers' multi-node modes are `extended` (each launcher starts one node's processes on every change:
# tests/strategies/test_deepspeed.py and test_accelerate.py).
@pytest.mark.parametrize(
    "strategy, launcher",
    [
        ("ddp", torchrun_node),
        pytest.param("fsdp", torchrun_node, marks=pytest.mark.extended),
        pytest.param("zero3", torchrun_node, marks=pytest.mark.extended),
        pytest.param("zero2", deepspeed_node, marks=pytest.mark.extended),
        pytest.param("accelerate-zero3", accelerate_node, marks=pytest.mark.extended),
    ],
    ids=lambda x: x if isinstance(x, str) else x.__name__.removesuffix("_node"),
)
def test_two_nodes_match_single(tmp_path, strategy, launcher, reference_run):
    _two_node_run(tmp_path, strategy, launcher)
    summary, rows = read_run(tmp_path)
    assert (summary["nodes"], summary["procs_per_node"], summary["world_size"]) == (2, 1, 2)
    assert summary["backend"] == "gloo"
    deviation = max_rel_diff(rows, reference_run[1])
    print(f"{strategy} on 2 nodes ({launcher.__name__}): largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < 1e-4
