"""Context parallel composed with tensor parallel, without FSDP, against the whole model in one
process:

    torchrun --nproc_per_node=4 tests/models/context_parallel_worker.py <out.json>

On a (cp 2) x (tp 2) mesh of gloo ranks, each case's model is split by tensor parallel first
(models/tensor_parallel.py, the model's own plan), then by models/context_parallel.py on the cp
dimension: its attention modules hold heads / 2 heads each, and the all-to-all shares out those.
Each rank runs one forward and backward of the same batch and compares the loss it returns and
the gradient of every parameter (the tensor-parallel shards gathered, the cp group's gradients
averaged: each rank's is its own tokens') with the whole model's. The Hugging Face Llama has 2
key/value heads, 1 on each tensor-parallel rank, which the all-to-all repeats for its 2 ranks;
over cp 4 alone, each of its 2 is repeated for 2 ranks, each rank receiving its queries' own.

Then what the Llamas' splits left of transformers' registry (its `sdpa` entry, and the attention
of a Llama built after them), and the head-and-tail shares torch's ring attention expects
(models/ring_attention.py), which torch cuts on the CPU too though its ring runs on CUDA only.
Writes <out.json>.rank<r>.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.train import distributed  # noqa: E402
from models.context_parallel import check_context_parallel, split_sequences  # noqa: E402
from models.ring_attention import head_tail_shares  # noqa: E402
from models.tensor_parallel import parallelize, plan_of  # noqa: E402
from models.zoo import build_model  # noqa: E402

SEQ_LEN, BATCH = 16, 2
LLAMA = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
# (model, model_kwargs, cp, tp, sequence parallel)
CASES = {
    "gpt, cp 2 x tp 2, sequence parallel": ("gpt-nano", {"n_head": 4}, 2, 2, True),
    "llama, cp 2 x tp 2": ("hf:LlamaConfig", LLAMA, 2, 2, False),
    "llama, cp 4": ("hf:LlamaConfig", LLAMA, 4, 1, False),
}


def _whole_gradients(model: torch.nn.Module, cp_group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
        dist.all_reduce(g, group=cp_group)
        grads[name] = g / dist.get_world_size(cp_group)
    return grads


def compare(case: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    spec, kwargs, cp, tp, sequence_parallel = CASES[case]
    mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
    torch.manual_seed(0)
    model = build_model(spec, kwargs)
    reference = copy.deepcopy(model)
    rows = torch.randint(0, model.vocab_size, (BATCH, SEQ_LEN + 1), generator=torch.Generator().manual_seed(1))
    inputs, targets = rows[:, :-1], rows[:, 1:]

    check_context_parallel(model, cp, SEQ_LEN, tp_size=tp)
    if tp > 1:
        parallelize(model, mesh["tp"], plan_of(model, tp, sequence_parallel))
    split_sequences(model, mesh["cp"])
    loss = model(inputs, targets)
    loss.backward()
    want = reference(inputs, targets)
    want.backward()

    held = _whole_gradients(model, mesh["cp"].get_group())
    wanted = dict(reference.named_parameters())
    return {
        "loss_difference": abs(loss.item() - want.item()),
        "largest_gradient_difference": max((held[n] - wanted[n].grad).abs().max().item() for n in held),
        "largest_gradient": max(p.grad.abs().max().item() for p in wanted.values()),
    }


def registry_left() -> dict:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return {
        "sdpa entry": "transformers'" if ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward else "replaced",
        "a new model's attention": build_model("hf:LlamaConfig", LLAMA).hf.config._attn_implementation,
    }


def ring_shares() -> dict:
    """The positions of this rank's share of a 16-token sequence over cp 2: chunks r and 3 - r of 4."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    positions = torch.arange(SEQ_LEN).expand(BATCH, SEQ_LEN)
    tokens = positions + 100
    tokens_share, positions_share = head_tail_shares(mesh["cp"], [tokens, positions])
    return {
        "cp_rank": mesh["cp"].get_local_rank(),
        "positions": positions_share[0].tolist(),
        "tokens_match": bool((tokens_share == positions_share + 100).all()),
    }


def main() -> None:
    out = sys.argv[1]
    env = distributed.init_distributed("cpu", 120)
    results: dict[str, dict] = {}
    try:
        for case in CASES:
            try:
                results[case] = compare(case)
            except Exception as exc:  # recorded, so the test names the case that failed
                results[case] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        results["registry"] = registry_left()
        results["ring shares"] = ring_shares()
        # gloo closes a rank's connections when it leaves: a rank still setting up the last mesh's
        # groups reads "Connection closed by peer" from one that left first.
        dist.barrier()
    finally:
        Path(f"{out}.rank{env.rank}").write_text(json.dumps(results, indent=1))
        distributed.shutdown_distributed()


if __name__ == "__main__":
    main()
