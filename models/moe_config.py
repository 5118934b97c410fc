"""The zoo's mixture-of-experts GPT sizes and routing options, without torch: the model
(models/moe.py) builds from them and the planner reads them; and the one refusal of an expert
parallel size, which the runtime (models/expert_parallel.py) and the planner share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    n_layer: int
    n_head: int
    n_embd: int
    n_experts: int  # experts per MoE layer
    top_k: int  # experts each token is routed to
    expert_hidden: int  # the SwiGLU width of each expert
    vocab_size: int = 50304
    block_size: int = 1024
    bias: bool = False
    dropout: float = 0.0
    # Every moe_every-th block has experts (1: all, Mixtral's; 2: every other, Switch's); the rest
    # keep the GPT's dense MLP.
    moe_every: int = 1
    # One expert of this width that every token goes through beside its routed ones (DeepSeek's and
    # Qwen2-MoE's shared expert); 0: none.
    shared_expert_hidden: int = 0
    # The routed experts' weights renormalised to sum to 1 over a token's top-k (Mixtral's); false:
    # the softmax probabilities as they are (Switch's at top-1, OLMoE's).
    norm_topk_prob: bool = True
    # The load-balancing loss's weight in the training loss (Switch's alpha).
    aux_loss_coef: float = 0.01
    # None: dropless, every routed token reaches its experts. A number: each expert takes at most
    # ceil(capacity_factor x k x T / E) tokens of each sequence of T, the rest of its tokens dropped.
    capacity_factor: float | None = None


MOE_PRESETS: dict[str, MoEConfig] = {
    "moe-nano": MoEConfig(
        n_layer=2, n_head=2, n_embd=64, n_experts=4, top_k=2, expert_hidden=128, vocab_size=128, block_size=256
    ),
    "moe-micro": MoEConfig(
        n_layer=4, n_head=4, n_embd=128, n_experts=8, top_k=2, expert_hidden=256, vocab_size=512, block_size=256
    ),
}


class ExpertParallelError(ValueError):
    """Experts that do not split over the expert-parallel ranks (one line, says what would)."""


def check_divides_experts(n_experts: int, ep_size: int, ranks: int | None = None, *, default: bool = False) -> None:
    """`ep_size` must divide the experts. What to use instead divides the experts and, where given,
    the `ranks` the expert-parallel groups also split; `default`: the size was the strategy's own
    (every data-parallel GPU), not one the user gave."""
    if n_experts % ep_size:
        fits = [d for d in range(1, n_experts + 1) if n_experts % d == 0 and (ranks is None or ranks % d == 0)]
        size = f"the default ep_size={ep_size} (every data-parallel GPU)" if default else f"ep_size={ep_size}"
        raise ExpertParallelError(
            f"{size} does not divide the model's {n_experts} experts: use strategy_options.ep_size="
            + " or ".join(map(str, fits))
        )
