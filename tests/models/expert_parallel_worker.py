"""models/expert_parallel.py on its own, over gloo, as a mesh would drive it:

    torchrun --nproc_per_node=4 tests/models/expert_parallel_worker.py <out.json> <model> <model_kwargs json>

The 4 ranks form a 2 x 2 mesh dp x ep (ranks 0,1 and 2,3 share their data-parallel index and so
form the expert-parallel groups; 0,2 and 1,3 hold the same experts). Every rank builds the model
from one seed and computes, in one process, the reference: the loss and gradients of the whole
global batch of 8 rows. Then it shards the experts over its ep group, runs its own 2 rows,
averages the dense gradients over all 4 ranks (as DDP would) and reduces the experts' with
reduce_expert_gradients, gathers the experts back and writes <out.json>.rank<r>: the largest
relative difference of the loss (mean over the ranks) and of every gradient from the reference,
and which experts it held.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.expert_parallel import expert_parameters, gather_experts, reduce_expert_gradients, shard_experts  # noqa: E402
from models.zoo import build_model  # noqa: E402

ROWS_PER_RANK, SEQ_LEN = 2, 16


def main(out: str, spec: str, kwargs: dict) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "ep"))
    torch.manual_seed(0)
    model = build_model(spec, kwargs)
    vocab = model.vocab_size
    rows = torch.randint(0, vocab, (world * ROWS_PER_RANK, SEQ_LEN + 1), generator=torch.Generator().manual_seed(1))

    loss = model(rows[:, :-1], rows[:, 1:])
    loss.backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    names = shard_experts(model, mesh.get_group("ep"))
    mine = rows[rank * ROWS_PER_RANK : (rank + 1) * ROWS_PER_RANK]
    local_loss = model(mine[:, :-1], mine[:, 1:])
    local_loss.backward()
    experts = set(map(id, expert_parameters(model)))
    for p in model.parameters():
        if id(p) not in experts and p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    reduce_expert_gradients(expert_parameters(model), mesh.get_group("dp"), world)
    mean_loss = local_loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world

    grads = {name: p.grad for name, p in model.named_parameters()}
    grads = gather_experts(grads, names, mesh.get_group("ep"))
    worst = {
        name: ((grads[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
        for name, ref in reference.items()
    }
    held = sorted({tuple(model.get_parameter(n).shape) for n in names})
    result = {
        "loss": loss.item(),
        "loss_rel_diff": abs(mean_loss.item() - loss.item()) / abs(loss.item()),
        "grad_rel_diff": worst,
        "sharded": names,
        "local_shapes": [list(s) for s in held],
    }
    Path(f"{out}.rank{rank}").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
