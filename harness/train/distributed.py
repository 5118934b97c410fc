"""Process-group set-up from whatever launcher started us (torchrun, deepspeed,
accelerate launch, srun+torchrun), or none: then a world of one."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from configs.schema import ConfigError

NO_CUDA = "device=cuda but no CUDA device is visible: use device=cpu or device=auto"


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # Processes on this node, as the launcher says; None: unknown (then every rank is on one node).
    local_world_size: int | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ranks_per_node(self) -> int:
        """What a strategy's "one node" means (hsdp's shard group, fsdp-tp's tensor-parallel group)."""
        return self.local_world_size or self.world_size


def launched_by_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


# Each launcher's count of the processes on this node (torchrun and accelerate launch, deepspeed).
_LOCAL_COUNTS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")


def check_nproc_under_launcher(nproc: int | None, env: Mapping[str, str] = os.environ) -> None:
    """nproc= starts processes only where no launcher did: under one, the launcher's count is the
    run's, and an nproc= it does not match (`torchrun --nproc_per_node=2 ... nproc=4`) would be
    dropped without a word, the run laid out for another world than asked. It may name the world
    or this node's processes (parabench's own jobs pass the world size they launched)."""
    if nproc is None:
        return
    counts = {int(env[key]) for key in ("WORLD_SIZE", *_LOCAL_COUNTS) if env.get(key, "").isdigit()}
    if not counts or nproc in counts:
        return
    world = env.get("WORLD_SIZE", "?")
    raise ConfigError(
        f"nproc={nproc}, but the launcher started {world} processes: nproc= starts processes only where no "
        f"launcher did; drop it, or have the launcher start {nproc} (torchrun --nproc_per_node={nproc})"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(NO_CUDA)
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def restart_hazard() -> str | None:
    """Why a torchrun restart of this job may fail to form its process group, or None.

    torchrun shares its own store with the workers by default, and a restarted attempt
    can read the previous attempt's peer addresses from it and fail to connect
    (pytorch/pytorch#135712); torchrun then gives up with restarts left unused."""
    restartable = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    if restartable and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return (
            "torchrun --max-restarts shares its store with the workers, so a restart can read a dead "
            "rank's address and fail (pytorch#135712): export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun"
        )
    return None


def init_distributed(requested_device: str, timeout_s: float) -> DistEnv:
    """Join (or, with no launcher, create) the default process group.

    A process group exists even for one process, so that every backend (FSDP's
    device mesh, DeepSpeed, Accelerate) runs the same code at any world size.
    """
    if not launched_by_launcher():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    hazard = restart_hazard()
    if hazard and rank == 0:
        print(f"parabench: warning: {hazard}", flush=True)  # stdout: stderr is the libraries' (library_output.py)
    device = pick_device(requested_device, local_rank)
    if not dist.is_initialized():
        # CPU tensors (gloo) still need a path on a GPU machine: offload and host-side metrics use it.
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), rank=rank, world_size=world)
    return DistEnv(rank, world, local_rank, device, local_world_size(world))


def local_world_size(world_size: int) -> int:
    """Processes per node: torchrun (and accelerate launch) say LOCAL_WORLD_SIZE, the deepspeed
    launcher LOCAL_SIZE; with neither, the whole world is taken to be one node."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return world_size


def all_reduce(values: list[float], op: dist.ReduceOp, device: torch.device) -> list[float]:
    """One collective for a handful of host numbers (float64, so byte counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=op)
    return t.tolist()


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def topology(env: DistEnv) -> dict[str, object]:
    """Nodes, processes per node and backend, for the results.

    The launcher says how many nodes joined where it can: torchrun (and accelerate
    launch, which runs it) in GROUP_WORLD_SIZE, the deepspeed launcher in CROSS_SIZE.
    Others leave it out, and then distinct host names count the nodes.
    """
    said = next((os.environ[name] for name in ("GROUP_WORLD_SIZE", "CROSS_SIZE") if name in os.environ), None)
    if said is not None:
        nodes = int(said)
    elif dist.is_initialized() and env.world_size > 1:
        hosts: list[str | None] = [None] * env.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        nodes = len(set(hosts))
    else:
        nodes = 1
    return {
        "nodes": nodes,
        "procs_per_node": env.world_size // max(nodes, 1),
        "backend": dist.get_backend() if dist.is_initialized() else None,
    }
