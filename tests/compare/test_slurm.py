"""The generated sbatch scripts: right node and task counts, and a rendezvous that
works. The test plays SLURM: a stand-in `srun` starts one copy of the command per
node with the variables SLURM would set, and `scontrol` names the nodes."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from harness.compare.slurm import SlurmJob
from harness.train.distributed import free_port
from tests.helpers import NANO, ROOT, env_for_tests, max_rel_diff, read_run, run_bounded, run_cli

FAKE_SRUN = """#!/bin/bash
# Stand-in for srun: start --ntasks copies of the command, one per "node", and wait.
ntasks=1
while [[ "$1" == --* ]]; do
  case "$1" in --ntasks=*) ntasks="${1#--ntasks=}";; esac
  shift
done
pids=()
for ((i = 0; i < ntasks; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SBATCH = """#!/bin/bash
# Stand-in for `sbatch --wait --parsable SCRIPT`: print a job id, run the script as the
# allocation would (its nodes, its output file), return its exit status.
script="${@: -1}"
nodes=$(sed -n 's/^#SBATCH --nodes=//p' "$script")
output=$(sed -n 's/^#SBATCH --output=//p' "$script")
job_id=$RANDOM
echo "$job_id"
SLURM_JOB_ID=$job_id SLURM_JOB_NUM_NODES=$nodes SLURM_JOB_NODELIST=127.0.0.1 bash "$script" > "$output" 2>&1
"""
FAKE_SCONTROL = """#!/bin/bash
# Stand-in for `scontrol show hostnames LIST`: one host a line.
tr ',' '\\n' <<< "$3"
"""


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _fake_slurm(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "srun", FAKE_SRUN)
    _executable(bin_dir / "scontrol", FAKE_SCONTROL)
    _executable(bin_dir / "sbatch", FAKE_SBATCH)
    env = env_for_tests()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def test_script_asks_for_the_right_nodes_and_tasks(tmp_path):
    job = SlurmJob(
        name="parabench-fsdp",
        nodes=2,
        procs_per_node=8,
        runner_args=["train", "strategy=fsdp"],
        log_path=tmp_path / "log.txt",
        partition="gpu",
    )
    script = job.script()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --partition=gpu" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--ntasks=2" in srun and "--nproc_per_node=8" in srun and '"--nnodes=$SLURM_JOB_NUM_NODES"' in srun
    assert re.search(r"--rdzv_endpoint=\$head_node:29500", srun) and "--rdzv_backend=c10d" in srun
    assert srun.endswith("train strategy=fsdp")


def test_script_runs_two_nodes_through_the_rendezvous(tmp_path, reference_run):
    out = tmp_path / "run"
    job = SlurmJob(
        name="parabench-ddp",
        nodes=2,
        procs_per_node=1,
        request_gpus=False,
        rdzv_port=free_port(),
        runner_args=["train", "strategy=ddp", f"out_dir={out}", *NANO],
        log_path=tmp_path / "slurm.log",
    )
    script = tmp_path / "job.sbatch"
    script.write_text(job.script())
    env = _fake_slurm(tmp_path)
    env.update(SLURM_JOB_NODELIST="127.0.0.1", SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="4242")
    proc = run_bounded(["bash", str(script)], env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary, rows = read_run(out)
    assert (summary["nodes"], summary["procs_per_node"]) == (2, 1)
    assert max_rel_diff(rows, reference_run[1]) < 1e-4


# A whole compare (single, its two noise runs and ddp, each a two-node job) through the stand-in
# scheduler: `extended`; the job script's two nodes and rendezvous run on every change (above).
@pytest.mark.extended
def test_compare_through_slurm_gathers_one_report(tmp_path):
    out = tmp_path / "compare"
    proc = run_cli(
        [
            "compare",
            "launcher=slurm",
            "nodes=2",
            "gpus_per_node=1",
            "device=cpu",
            "strategies=[single,ddp]",
            f"rdzv_port={free_port()}",
            f"out_dir={out}",
            *NANO[1:],
        ],
        env=_fake_slurm(tmp_path),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # The noise runs (the default 2) have scripts of their own: the reference's stays the reference's.
    assert sorted(p.name for p in (out / "slurm").iterdir()) == [
        "parabench-ddp.sbatch",
        "parabench-single-noise-1.sbatch",
        "parabench-single-noise-2.sbatch",
        "parabench-single.sbatch",
    ]
    assert "noise_seed" not in (out / "slurm" / "parabench-single.sbatch").read_text()
    assert "noise_seed=2" in (out / "slurm" / "parabench-single-noise-2.sbatch").read_text()
    assert "#SBATCH --nodes=2" in (out / "slurm" / "parabench-ddp.sbatch").read_text()
    results = json.loads((out / "results.json").read_text())
    by_name = {r["name"]: r for r in results["strategies"]}
    assert by_name["ddp"]["status"] == "ok" and by_name["ddp"]["max_rel_loss_diff"] < 1e-4
    summary = json.loads((out / "ddp" / "summary.json").read_text())
    assert (summary["nodes"], summary["world_size"]) == (2, 2)
    assert (out / "report.html").is_file()


def test_slurm_without_sbatch_says_what_to_do(tmp_path):
    env = env_for_tests()
    env["PATH"] = "/usr/bin:/bin"
    proc = run_cli(["compare", "launcher=slurm", "gpus_per_node=8"], env=env, timeout=60)
    assert proc.returncode == 2 and "sbatch is not on PATH" in proc.stderr and "dry_run=true" in proc.stderr


def test_dry_run_judges_the_compute_nodes_device_not_the_login_nodes(tmp_path):
    # A login node often has no GPU: a GPU-only strategy is still scripted for the GPU nodes.
    out = tmp_path / "cmp"
    args = ["compare", "launcher=slurm", "nodes=2", "gpus_per_node=8", "dry_run=true", "model=gpt-nano"]
    proc = run_cli([*args, "strategies=[single,zero3-zeropp]", f"out_dir={out}"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "slurm" / "parabench-zero3-zeropp.sbatch").is_file()


def test_the_example_in_configs_is_what_the_generator_writes():
    """configs/slurm/train.sbatch is documentation: it must not drift from harness.compare.slurm."""
    example = (ROOT / "configs" / "slurm" / "train.sbatch").read_text().splitlines()
    generated = (
        SlurmJob(
            name="parabench-fsdp",
            nodes=2,
            procs_per_node=8,
            log_path=Path("slurm-%j.log"),
            runner_args=["train", "strategy=fsdp", "model=gpt2-1.5b", "precision=bf16", "out_dir=runs/slurm-fsdp"],
            python="python",
            workdir="$SLURM_SUBMIT_DIR",
        )
        .script()
        .splitlines()
    )
    # The example adds only comment lines of its own.
    assert [line for line in example if line in generated] == generated
    assert all(line.startswith("# ") for line in example if line not in generated)
