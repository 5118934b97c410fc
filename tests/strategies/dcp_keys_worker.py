"""The DCP checkpoint each torch mesh preset writes, as keys and shapes:

    torchrun --nproc_per_node=4 tests/strategies/dcp_keys_worker.py <out.json> <dir>

Each rank, for each preset in PRESETS (its sizes fixed, so a change of default does not change the
file), builds a four-block gpt-nano from one seed, sets the strategy up on its mesh, takes one step
and saves a checkpoint under <dir>; rank 0 reads the checkpoint's metadata back and writes
<out.json>: {"<preset>": {"<key>": [shape] or "bytes"}} (or {"error": ...}).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.train import distributed  # noqa: E402
from harness.train.optimizer import adamw_factory  # noqa: E402
from models.zoo import build_model  # noqa: E402
from strategies.base import RunContext  # noqa: E402
from strategies.registry import default_registry  # noqa: E402

WORLD_SIZE = 4
MICRO_BATCH, SEQ_LEN = 4, 16
# Each preset with the sizes it is recorded at: a mesh of two dimensions of 2 where it has two.
PRESETS = {
    "fsdp": {},
    "fsdp-grad-op": {},
    "fsdp-offload": {},
    "hsdp": {"shard_size": 2},
    "fsdp-tp": {"tp_size": 2},
    "ddp-tp": {"tp_size": 2},
    "zero1-tp": {"tp_size": 2},
    "fsdp-pp": {"pp_size": 2},
    "fsdp-cp": {"cp_size": 2},
}


def saved_keys(name: str, options: dict, env: distributed.DistEnv, root: Path) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    registry = default_registry()
    torch.manual_seed(0)
    model = build_model("gpt-nano", {"n_layer": 4})
    ctx = RunContext(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=env.device,
        precision="fp32",
        micro_batch=MICRO_BATCH,
        grad_accum=1,
        grad_clip=1.0,
        mesh=registry.mesh_layout(name, env.world_size, env.world_size, **options),
    )
    strategy = registry.create(name, ctx, **options)
    try:
        strategy.check_model(model)
        wrapped, _ = strategy.setup(model, adamw_factory(1e-3, (0.9, 0.95), 0.1))
        # The same rows on every rank: only the keys and shapes are read.
        rows = torch.randint(0, 128, (MICRO_BATCH, SEQ_LEN + 1), generator=torch.Generator().manual_seed(1))
        loss = wrapped(rows[:, :-1], rows[:, 1:])
        strategy.backward(loss)
        strategy.step()
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        strategy.save(path)
        dist.barrier()
        if env.rank != 0:
            return {}
        metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        return {
            key: list(value.size) if isinstance(value, TensorStorageMetadata) else "bytes"
            for key, value in sorted(metadata.items())
        }
    finally:
        strategy.teardown()


def main() -> None:
    out, root = sys.argv[1], Path(sys.argv[2])
    env = distributed.init_distributed("cpu", 120)
    results: dict[str, dict] = {}
    try:
        for name, options in PRESETS.items():
            try:
                results[name] = saved_keys(name, options, env, root)
            except Exception as exc:  # recorded, so the test names the preset that failed
                results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    finally:
        if env.rank == 0:
            Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        distributed.shutdown_distributed()


if __name__ == "__main__":
    main()
