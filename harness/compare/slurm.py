"""SLURM batch scripts for multi-node runs: `srun` starts one torchrun agent per
node, and the agents meet through torchrun's c10d rendezvous on the first node.

parabench brings no launcher of its own: the script is what a user would write
by hand, so it can be read, edited and submitted without parabench.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.train import RUNNER


@dataclass(frozen=True)
class SlurmJob:
    name: str
    nodes: int
    procs_per_node: int  # torchrun workers per node: one per GPU
    runner_args: list[str]  # e.g. ["train", "strategy=fsdp", "out_dir=..."]
    log_path: Path
    rdzv_port: int = 29500
    time_limit: str = "01:00:00"
    partition: str | None = None
    request_gpus: bool = True  # False for CPU-only nodes (gloo)
    python: str = sys.executable
    workdir: str = str(Path(RUNNER).parent)  # the checkout, as the nodes see it ($VARIABLES expand)

    def script(self) -> str:
        partition = f"#SBATCH --partition={self.partition}\n" if self.partition else ""
        gpus = f"#SBATCH --gpus-per-node={self.procs_per_node}\n" if self.request_gpus else ""
        torchrun = [
            self.python,
            "-m",
            "torch.distributed.run",
            "--nnodes=$SLURM_JOB_NUM_NODES",
            f"--nproc_per_node={self.procs_per_node}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=$head_node:{self.rdzv_port}",
            "--rdzv_id=$SLURM_JOB_ID",
            "runner.py",
            *self.runner_args,
        ]
        command = " ".join(_shell_word(part) for part in torchrun)
        return (
            "#!/bin/bash\n"
            f"#SBATCH --job-name={self.name}\n"
            f"#SBATCH --nodes={self.nodes}\n"
            "#SBATCH --ntasks-per-node=1\n"  # one torchrun agent per node; it starts the GPU workers
            f"{gpus}{partition}"
            f"#SBATCH --time={self.time_limit}\n"
            f"#SBATCH --output={self.log_path}\n"
            "set -euo pipefail\n"
            f"cd {_shell_word(self.workdir)}\n"
            "# The first node of the allocation hosts the c10d rendezvous store.\n"
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}\n"
            "# torchrun restarts need a store of their own (pytorch#135712).\n"
            "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n"
            # --kill-on-bad-exit: a node that fails takes the others down instead of leaving them waiting.
            f"srun --kill-on-bad-exit=1 --ntasks={self.nodes} --ntasks-per-node=1 {command}\n"
        )


def _shell_word(part: str) -> str:
    """Words with $-variables go in double quotes, for the shell to expand; the rest in single."""
    return f'"{part}"' if "$" in part else shlex.quote(part)


def write_scripts(jobs: list[SlurmJob], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for job in jobs:
        path = directory / f"{job.name}.sbatch"
        path.write_text(job.script())
        paths.append(path)
    return paths


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def submit_and_wait_command(script: Path, job_log: Path) -> list[str]:
    """Submit one script and block until the job ends (`sbatch --wait`), then print the
    job's own log: the supervisor's log then holds the job id, the job's output (for
    failure classification) and the job's exit status. Strategies run one after
    another on the same allocation size, as a local compare does."""
    return [
        "bash",
        "-c",
        'sbatch --wait --parsable "$1"; status=$?; cat "$2" 2>/dev/null; exit $status',
        "sbatch-wait",
        str(script),
        str(job_log),
    ]


def cancel_submitted(log_text: str) -> None:
    """scancel the job whose id `sbatch --parsable` printed: stopping `sbatch --wait`
    (timeout, Ctrl-C) leaves the job itself queued or running."""
    match = re.search(r"^(\d+)(;\S+)?$", log_text, re.M)
    if match and shutil.which("scancel"):
        subprocess.call(["scancel", match.group(1)])
