"""strategies/pipeline_parts.py in one process: a process group of one rank holding both stages of a
cut (interleaved 1F1B), so the schedule, its loss scaling and the tied-gradient sum run without
other processes: the loss and every gradient are the whole model's; and a stage learns its shapes
on zeros, not on uninitialised memory, which a forward reading values would trip on."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import extract_tensor_metas

from models.blocks import find_blocks
from models.stage_plan import cut_plan
from models.stages import RankStages, cut
from models.zoo import build_model
from strategies.pipeline_parts import build_schedule, pipeline_stage, run_schedule, sum_tied_gradients

SEQ = 8


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _pipelined(spec: str, group) -> tuple[torch.nn.Module, RankStages, list, object]:
    torch.manual_seed(0)
    model = build_model(spec)
    plan = cut_plan(model, find_blocks(model).modules, 2, SEQ)
    roots = {stage: cut(model, plan, stage) for stage in range(2)}
    stages = [pipeline_stage(root, index, 2, torch.device("cpu"), group) for index, root in roots.items()]
    schedule = build_schedule(stages, "interleaved-1f1b", microbatches=2, grad_accum=1)
    return model, RankStages(model, plan, roots, lambda inputs, targets: None), stages, schedule


def test_one_rank_holding_both_stages_gives_the_whole_models_loss_and_gradients(group):
    model, held, stages, schedule = _pipelined("tests.user_models:build_decoder", group)
    inputs, targets = (torch.randint(0, model.vocab_size, (4, SEQ)) for _ in range(2))
    whole = model(inputs, targets)
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters(remove_duplicate=False)}
    model.zero_grad(set_to_none=True)

    loss = run_schedule(schedule, stages, inputs, targets, grad_accum=1)
    sum_tied_gradients(held, None)  # both ends of the tie on this rank: summed in place
    torch.testing.assert_close(loss, whole.detach(), rtol=1e-6, atol=0)
    for name, p in held.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    assert torch.equal(held.get_parameter("embed.weight").grad, held.get_parameter("unembed.weight").grad)


def test_a_forward_that_reads_a_value_runs_in_the_pipeline(group):
    """build_untraceable raises on a loss that is not finite: the last stage's shape-learning run
    on uninitialised activations could give one."""
    model, _, stages, schedule = _pipelined("tests.user_models:build_untraceable", group)
    inputs = torch.randint(0, model.vocab_size, (4, SEQ))
    loss = run_schedule(schedule, stages, inputs, inputs, grad_accum=1)
    torch.testing.assert_close(loss, model(inputs, inputs).detach(), rtol=1e-6, atol=0)


def test_activations_made_from_their_shapes_are_zeros(group):
    """torch's PipelineStage makes them with `_to_tensor`, which pipeline_stage's stages override."""
    assert "_to_tensor" in vars(PipelineStage)
    stage = pipeline_stage(torch.nn.Linear(2, 2), 0, 1, torch.device("cpu"), group)
    (meta,) = extract_tensor_metas((torch.full((64, 64), float("nan")),))
    assert torch.equal(stage._to_tensor(meta), torch.zeros(64, 64))
