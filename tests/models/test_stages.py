"""The pipeline cut in one process, no process group (models/stage_plan.py, models/stages.py):
the stages of parabench's GPT, a Hugging Face Llama (untied and tied) and a user's model with a
tie across stages, run one after another and backward in reverse, give the whole model's loss
and every gradient exactly (a tied weight's two shares summed); the plan is the same traced on
the meta device and on the real weights; and every model the checks refuse says why in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from models.blocks import find_blocks
from models.on_meta import on_meta
from models.stage_plan import CutPlan, StagesError, cut_plan
from models.stages import RankStages, cut
from models.zoo import build_model

LLAMA = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
}
SEQ = 8


def _plan(spec: str, kwargs: dict, stages: int) -> tuple[nn.Module, CutPlan]:
    torch.manual_seed(0)
    model = build_model(spec, kwargs)
    return model, cut_plan(model, find_blocks(model).modules, stages, SEQ)


@pytest.mark.parametrize(
    "spec, kwargs, stages",
    [
        ("gpt-nano", {"n_layer": 4}, 2),
        ("hf:LlamaConfig", LLAMA, 2),
        ("hf:LlamaConfig", {**LLAMA, "num_hidden_layers": 6}, 3),
        ("hf:LlamaConfig", {**LLAMA, "tie_word_embeddings": True}, 2),
        ("tests.user_models:build_decoder", {}, 3),
    ],
)
def test_the_stages_run_in_turn_give_the_whole_models_loss_and_gradients(spec, kwargs, stages):
    model, plan = _plan(spec, kwargs, stages)
    inputs, targets = (torch.randint(0, model.vocab_size, (3, SEQ)) for _ in range(2))
    whole_loss = model(inputs, targets)
    whole_loss.backward()
    whole = {name: p.grad.clone() for name, p in model.named_parameters(remove_duplicate=False)}
    model.zero_grad(set_to_none=True)

    roots = [cut(model, plan, stage) for stage in range(plan.stage_count)]
    runs, received = [], ()
    for root in roots:
        out = root(*received, inputs=inputs, targets=targets)
        runs.append((received, out))
        received = (out.detach().requires_grad_(),)
    assert torch.equal(out, whole_loss)
    grad = None
    for received, out in reversed(runs):
        out.backward(grad)
        grad = received[0].grad if received else None

    copies = {tie.copy for tie in plan.ties}
    for stage, root in enumerate(roots):
        for name, p in root.named_parameters():
            if name not in copies and name not in {tie.first for tie in plan.ties}:
                assert torch.equal(p.grad, whole[name]), (stage, name)
    for tie in plan.ties:
        shares = roots[0].get_parameter(tie.first).grad + roots[-1].get_parameter(tie.copy).grad
        assert torch.equal(shares, whole[tie.first]), tie
    # Every key of the bare model's state dict, under its own name, on some stage.
    assert set().union(*(root.state_dict() for root in roots)) == set(model.state_dict())


def test_ties_are_found_by_identity_and_the_last_stage_holds_a_copy():
    model, plan = _plan("tests.user_models:build_decoder", {}, 3)
    assert [(tie.first, tie.copy) for tie in plan.ties] == [("embed.weight", "unembed.weight")]
    assert (plan.first_parts, plan.last_parts) == (("embed",), ("final_norm", "unembed"))
    last = cut(model, plan, 2)
    copy = last.get_parameter("unembed.weight")
    assert copy is not model.embed.weight and torch.equal(copy, model.embed.weight)
    _, gpt = _plan("gpt-nano", {"n_layer": 4}, 2)
    assert [(tie.first, tie.copy) for tie in gpt.ties] == [("wte.weight", "lm_head.weight")]


def test_the_plan_traced_on_the_meta_device_is_the_one_of_the_real_weights():
    with on_meta():
        meta = build_model("hf:LlamaConfig", LLAMA)
    _, real = _plan("hf:LlamaConfig", LLAMA, 2)
    assert cut_plan(meta, find_blocks(meta).modules, 2, SEQ) == real
    assert real.blocks == tuple(f"hf.model.layers.{i}" for i in range(4))
    assert (real.first_parts, real.last_parts) == (("hf.model.embed_tokens",), ("hf.lm_head", "hf.model.norm"))
    assert real.ties == ()


def test_a_rank_holding_two_stages_sees_their_modules_under_the_models_names():
    model, plan = _plan("gpt-nano", {"n_layer": 4}, 4)
    roots = {stage: cut(model, plan, stage) for stage in (1, 3)}
    held = RankStages(model, plan, roots, lambda inputs, targets: torch.zeros(()))
    assert set(held.state_dict()) == set(roots[1].state_dict()) | set(roots[3].state_dict())
    assert {name.split(".")[0] for name in held.state_dict()} == {"blocks", "ln_f", "lm_head"}
    assert held.held_weight("lm_head.weight") is roots[3].get_parameter("lm_head.weight")
    assert held.held_weight("wte.weight") is None


def test_a_model_that_reads_a_value_is_planned_on_its_real_weights():
    """The meta device cannot run it (preflight lets it pass); its real weights can."""
    spec = "tests.user_models:build_untraceable"
    with on_meta():
        meta = build_model(spec)
    assert cut_plan(meta, find_blocks(meta).modules, 2, SEQ) is None
    _, plan = _plan(spec, {}, 2)
    assert plan.spans == (range(0, 2), range(2, 3))


def test_residual_gru_blocks_can_be_cut():
    """build_recurrent: each ResidualGRU takes the hidden state and returns it, nothing between."""
    _, plan = _plan("tests.user_models:build_recurrent", {}, 2)
    assert plan.blocks == ("layers.0", "layers.1") and plan.last_parts == ("head",)


class Mix(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        out = x + torch.tanh(self.proj(x))
        return out if scale is None else out * scale


class Toy(nn.Module):
    """Embedding, four Mix blocks, head: each subclass breaks one thing the cut needs."""

    def __init__(self, vocab: int = 32, width: int = 16):
        super().__init__()
        self.vocab_size = vocab
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Mix(width) for _ in range(4))
        self.head = nn.Linear(width, vocab)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.run_blocks(self.embed(inputs)), targets)


class SharedBlock(Toy):
    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        return super().run_blocks(self.blocks[0](x))


class SkippedBlock(Toy):
    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks[:-1]:
            x = block(x)
        return x


class Reversed(Toy):
    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in reversed(self.blocks):
            x = block(x)
        return x


class PairBlock(Mix):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), x.mean()


class TupleBlocks(Toy):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(PairBlock(16) for _ in range(4))

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x, _ = block(x)
        return x


class Gated(Toy):
    """Every block is given a gate computed by a module with weights, before the blocks."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(16, 1)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        gate = torch.sigmoid(self.gate(x))
        for block in self.blocks:
            x = block(x, gate)
        return self.loss(x, targets)


class Regularised(Toy):
    """The loss reads the embeddings again, after the blocks."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        embedded = self.embed(inputs)
        return self.loss(self.run_blocks(embedded), targets) + embedded.pow(2).mean()


class RecallingMix(Mix):
    def __init__(self, width: int, memory: list[torch.Tensor]):
        super().__init__(width)
        self.memory = memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x + self.memory[-1].mean())


class Recalling(Toy):
    """The blocks read the embeddings from a memory the forward fills, not from an argument."""

    def __init__(self):
        super().__init__()
        self.memory: list[torch.Tensor] = []
        self.blocks = nn.ModuleList(RecallingMix(16, self.memory) for _ in range(4))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.memory.append(self.embed(inputs))
        return self.loss(self.run_blocks(self.memory[-1]), targets)


class Logits(Toy):
    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_blocks(self.embed(inputs)))


class FunctionalHead(Toy):
    """The head multiplies by the embedding's weight itself, not through a module of its own."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.run_blocks(self.embed(inputs)) @ self.embed.weight.T
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class MiddleNorm(Toy):
    """A module with weights runs between two blocks, not at a cut."""

    def __init__(self):
        super().__init__()
        self.mid = nn.LayerNorm(16)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mid(self.blocks[0](x))
        for block in self.blocks[1:]:
            x = block(x)
        return x


class OwnWeight(Toy):
    """A weight directly on the model, which holds the blocks."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.run_blocks(self.embed(inputs) * self.scale), targets)


def _refusal(model: nn.Module, stages: int = 2) -> str:
    with pytest.raises(StagesError) as err:
        cut_plan(model, find_blocks(model).modules, stages, SEQ)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "model, says",
    [
        # (1) each block once, in order, taking and returning the hidden state
        (SharedBlock(), "block blocks.0 runs 2 times in SharedBlock's forward"),
        (SkippedBlock(), "block blocks.3 never runs in SkippedBlock's forward"),
        (Reversed(), "runs its blocks in another order than the model lists them"),
        (TupleBlocks(), "block blocks.0 returns a tuple: the cut passes one tensor from block to block"),
        # (2) nothing between the blocks at a cut: the zoo's mlp adds its residual outside them
        (build_model("mlp"), "changes block layers.1's output before block layers.2 takes it"),
        # (3) a block's other arguments, and what runs after a cut, from the inputs alone
        (Gated(), "block blocks.2's argument 1 is computed from weights read before the blocks"),
        (Regularised(), "computes pow after block blocks.3 from weights read before the blocks"),
        (Recalling(), "computes mean in block blocks.2 from weights read before the blocks"),
        # (4) the forward returns the loss
        (Logits(), "Logits's forward returns a tensor of shape (2, 8, 32), not the loss"),
        # where weights sit and are read
        (FunctionalHead(), "reads embed.weight outside its module (directly)"),
        (MiddleNorm(), "mid runs between blocks blocks.0 and blocks.1 with weights of its own"),
        (OwnWeight(), "the weight scale sits on OwnWeight, which holds the blocks"),
        (Toy(), "5 pipeline stages need at least 5 blocks, and this Toy has 4"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, nn.Module) else "",
)
def test_a_model_the_cut_cannot_take_is_refused_in_one_line(model, says):
    assert says in _refusal(model, 5 if says.startswith("5 pipeline") else 2)


def test_a_recurrent_model_without_repeated_layers_is_refused():
    message = _refusal(build_model("tests.user_models:build_gru"))
    assert "cuts a model between its blocks, and GRULM has none" in message and "model_blocks=" in message


def test_each_refused_toy_runs_as_a_whole_model():
    """The refusals are the cut's, not broken models: each runs forward as it is."""
    tokens = torch.randint(0, 32, (2, SEQ))
    for cls in (SharedBlock, SkippedBlock, Reversed, TupleBlocks, Gated, Regularised, Recalling, MiddleNorm):
        assert cls()(tokens, tokens).dim() == 0
    assert FunctionalHead()(tokens, tokens).dim() == 0
