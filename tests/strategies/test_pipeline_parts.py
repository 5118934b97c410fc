"""strategies/pipeline_parts.py in one process: a process group of one rank holding both stages of a
cut (interleaved 1F1B), so the schedule, its loss scaling and the tied-gradient sum run without
other processes: the loss and every gradient are the whole model's, also under zero-bubble with each
stage's units FSDP2's over the one rank, resharded after forward; and a stage learns its shapes on
zeros, not on uninitialised memory, which a forward reading values would trip on."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import extract_tensor_metas

from models.blocks import find_blocks
from models.stage_plan import cut_plan
from models.stages import RankStages, cut, stage_blocks
from models.zoo import build_model
from strategies.parallelize import apply_engine
from strategies.pipeline_parts import build_schedule, pipeline_stage, run_schedule, sum_tied_gradients

SEQ = 8
DECODER = "tests.user_models:build_decoder"  # its head tied to its embedding across the two stages


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _pipelined(
    spec: str, group, schedule: str = "interleaved-1f1b", before_stages=None
) -> tuple[torch.nn.Module, RankStages, list, object]:
    """`before_stages(plan, roots)`: lays the cut stages out before torch's stages are made of them."""
    torch.manual_seed(0)
    model = build_model(spec)
    plan = cut_plan(model, find_blocks(model).modules, 2, SEQ)
    roots = {stage: cut(model, plan, stage) for stage in range(2)}
    if before_stages is not None:
        before_stages(plan, roots)
    stages = [pipeline_stage(root, index, 2, torch.device("cpu"), group) for index, root in roots.items()]
    built = build_schedule(stages, schedule, microbatches=2, grad_accum=1)
    return model, RankStages(model, plan, roots, lambda inputs, targets: None), stages, built


def _whole_models(spec: str, inputs, targets) -> tuple[torch.Tensor, dict]:
    """The loss and the gradients of the model _pipelined cuts, built again (the stages share its
    modules, which a layout changes)."""
    torch.manual_seed(0)
    model = build_model(spec)
    whole = model(inputs, targets)
    whole.backward()
    return whole.detach(), {name: p.grad for name, p in model.named_parameters(remove_duplicate=False)}


def test_one_rank_holding_both_stages_gives_the_whole_models_loss_and_gradients(group):
    model, held, stages, schedule = _pipelined(DECODER, group)
    inputs, targets = (torch.randint(0, model.vocab_size, (4, SEQ)) for _ in range(2))
    whole, expected = _whole_models(DECODER, inputs, targets)

    loss = run_schedule(schedule, stages, inputs, targets, grad_accum=1)
    sum_tied_gradients(held, None)  # both ends of the tie on this rank: summed in place
    torch.testing.assert_close(loss, whole, rtol=1e-6, atol=0)
    for name, p in held.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    assert torch.equal(held.get_parameter("embed.weight").grad, held.get_parameter("unembed.weight").grad)


def test_zero_bubble_under_fsdp_resharded_after_forward_gives_every_gradient(group):
    """zero-bubble splits each backward: the input half lists the weights the stage has registered,
    the weight half later computes their gradients. A block resharded after forward had its shards
    registered, not the gathered weights the forward used: the last stage's block got no gradient at
    all (fsdp + pp_size 2 on 4 ranks trained a curve of its own: 4.7270 at step 2, single 4.6887)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))

    def sharded(plan, roots):
        for index, root in roots.items():
            apply_engine(stage_blocks(plan, index, root), root, mesh, "fsdp", True, {})

    model, held, stages, schedule = _pipelined(DECODER, group, "zero-bubble", sharded)
    inputs, targets = (torch.randint(0, model.vocab_size, (4, SEQ)) for _ in range(2))
    whole, expected = _whole_models(DECODER, inputs, targets)

    loss = run_schedule(schedule, stages, inputs, targets, grad_accum=1)
    sum_tied_gradients(held, None)
    torch.testing.assert_close(loss, whole, rtol=1e-6, atol=0)
    for name, p in held.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.full_tensor(), expected[name], rtol=1e-5, atol=1e-7, msg=name)


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
