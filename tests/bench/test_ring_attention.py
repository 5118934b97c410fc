"""bench/ring_attention_rank.py times one rank of load-balanced ring attention on a GPU; the
schedule it times must compute that rank's share of causal attention over the whole sequence.
Checked here on the CPU's flash kernel, every rank at cp 1, 2 and 4."""

from __future__ import annotations

import pytest
import torch

from bench.ring_attention_rank import rank_attention


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_each_ranks_rounds_give_its_chunks_of_whole_causal_attention(cp):
    torch.manual_seed(0)
    heads, head_dim, seq = 2, 8, 16 * cp
    q, k, v = (torch.randn(1, heads, seq, head_dim) for _ in range(3))
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    c = seq // (2 * cp)
    for rank in range(cp):
        held = [*range(rank * c, (rank + 1) * c), *range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
        out = rank_attention(q[:, :, held], k, v, rank, cp)
        assert torch.allclose(out, whole[:, :, held], atol=1e-6), rank
