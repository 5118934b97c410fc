"""precision=fp8: which layers go to float8, where it may run and who refuses it, and fp8 training
on the CPU (torch's scaled matmul gives float8's numerics there): single and FSDP2 with float8
all-gathers at world size 2, resumed bit for bit."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from configs.schema import ConfigError, load_config
from harness.compare.compare_cli import REFERENCE, run_settings
from harness.compare.compare_config import load_compare_config
from harness.train.checkpoint import _changes_numbers
from models.activation_checkpointing import enable_checkpointing
from models.blocks import find_blocks
from models.zoo import build_model
from strategies import float8
from strategies.base import ModelUnsupported, StrategyError
from strategies.registry import default_registry
from tests.helpers import losses_by_step, train

pytest.importorskip("torchao")


def _block_linears(model: nn.Module) -> set[str]:
    blocks = find_blocks(model, None)
    inside = {id(m) for block in blocks.modules for m in block.modules()}
    return {name for name, m in model.named_modules() if id(m) in inside and isinstance(m, nn.Linear)}


def test_only_the_blocks_linear_layers_go_to_float8():
    from torchao.float8.float8_linear import Float8Linear

    model = build_model("gpt-nano", {})
    expected = _block_linears(model)
    converted = float8.convert_to_float8(model, find_blocks(model, None), "tensorwise", all_gather=False)
    in_float8 = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == len(expected) == len(in_float8) > 0
    assert in_float8 == expected
    assert not isinstance(model.lm_head, Float8Linear)  # the head stays in bf16, as torchtitan keeps it


def test_a_model_without_blocks_is_one_line():
    model = nn.Sequential(nn.Linear(32, 32))
    with pytest.raises(StrategyError, match="model_blocks="):
        float8.convert_to_float8(model, find_blocks(model, None), "tensorwise", all_gather=False)


def test_without_torchao_or_fp8_tensor_cores_it_says_why(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "pip install 'parabench[fp8]'" in float8.fp8_unavailable_reason(torch.device("cpu"))
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    reason = float8.fp8_unavailable_reason(torch.device("cuda"))
    assert "A100" in reason and "compute capability 8.0" in reason and "precision=bf16" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert float8.fp8_unavailable_reason(torch.device("cuda")) is None
    assert float8.fp8_unavailable_reason(torch.device("cpu")) is None


@pytest.mark.parametrize("name", ["zero2", "fsdp-tp", "ddp-tp", "accelerate-fsdp", "dataparallel"])
def test_strategies_without_float8_layers_are_skipped_with_the_reason(name):
    entry = default_registry().get(name)
    assert "precision=bf16" in entry.cls.fp8_refusal(entry.options)
    if entry.available:  # what preflight raises, and a compare skips the strategy on
        with pytest.raises(ModelUnsupported, match="precision=bf16"):
            float8.check_fp8(entry, torch.device("cpu"))


@pytest.mark.parametrize("name", ["single", "ddp", "fsdp", "hsdp", "fsdp-pp", "fsdp-cp"])
def test_torch_strategies_train_in_fp8(name):
    float8.check_fp8(default_registry().get(name), torch.device("cpu"))


def test_float8_all_gathers_need_fsdp2_and_tensorwise_scaling():
    registry = default_registry()

    def gathers(name: str, scaling: str, asked: bool = True) -> bool:
        return float8.gathers_in_fp8(registry.get(name).cls.__new__(registry.get(name).cls), scaling, asked)

    assert gathers("fsdp", "tensorwise")
    assert not gathers("fsdp", "rowwise")
    assert not gathers("fsdp", "tensorwise", asked=False)
    assert not gathers("ddp", "tensorwise")


def test_fp8_settings_and_the_reference_precision():
    with pytest.raises(ConfigError, match="fp8_scaling='blockwise' is not one of tensorwise, rowwise"):
        load_config(["precision=fp8", "fp8_scaling=blockwise"])
    cfg = load_compare_config(["precision=fp8", "strategies=[single,fsdp]"])
    assert run_settings(cfg, REFERENCE, {})[1]["precision"] == "bf16"  # fp8 is judged against bf16
    assert "precision" not in run_settings(cfg, "fsdp", {})[1]
    # A resume notes a change of fp8 settings only where one of the two runs trains in fp8.
    saved = {"precision": "bf16"}
    assert not _changes_numbers("fp8_scaling", {"precision": "bf16", "fp8_scaling": "rowwise"}, saved)
    assert _changes_numbers("fp8_scaling", {"precision": "fp8", "fp8_scaling": "rowwise"}, saved)


@pytest.fixture(scope="module")
def fsdp_fp8(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-fp8")
    return out, train(out, "fsdp", nproc=2, extra=["precision=fp8", "checkpoint_every=5", "keep_last=5"])


@pytest.mark.extended  # two runs beside bf16's; fp8 trains on every change in the FSDP run below
def test_fp8_trains_what_bf16_trains_with_other_numbers(tmp_path):
    summary, _ = train(tmp_path / "fp8", "single", extra=["precision=fp8"])
    assert summary["fp8"] == f"{len(_block_linears(build_model('gpt-nano', {})))} linear layers in float8 (tensorwise)"
    train(tmp_path / "bf16", "single", extra=["precision=bf16"])
    fp8, bf16 = losses_by_step(tmp_path / "fp8"), losses_by_step(tmp_path / "bf16")
    differences = [abs(fp8[step] - bf16[step]) / bf16[step] for step in bf16]
    assert max(differences) > 0  # float8's rounding is not bf16's
    assert max(differences) < 1e-2


def test_fsdp_gathers_in_float8_and_resumes_bit_for_bit(fsdp_fp8, tmp_path):
    out, (summary, _) = fsdp_fp8
    assert summary["fp8"].endswith(", all-gathered in float8")
    # The scales the uninterrupted run computed after step 5 are computed again after the load.
    train(tmp_path, "fsdp", nproc=2, extra=["precision=fp8", f"resume={out}/checkpoints/step_5"])
    whole, resumed = losses_by_step(out), losses_by_step(tmp_path)
    assert resumed and all(resumed[step] == whole[step] for step in resumed)


def test_list_says_where_fp8_runs_and_who_trains_it(monkeypatch):
    from harness.train import list_cli

    lines = list_cli.fp8_lines(default_registry())
    trained_by = lines[2].split(": ", 1)[1].split(";")[0].split(", ")
    assert "fsdp" in trained_by and "zero2" not in trained_by and "fsdp-tp" not in trained_by
    monkeypatch.setattr(list_cli, "fp8_unavailable_reason", lambda device: "torchao is not installed: pip install x")
    assert list_cli.fp8_lines(default_registry())[1] == "  [unavailable: torchao is not installed: pip install x]"


def _fsdp_fp8_gradients(selective: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("gpt-nano", {})
    blocks = find_blocks(model)
    float8.convert_to_float8(model, blocks, "tensorwise", all_gather=True)
    if selective:
        enable_checkpointing(model, blocks, selective=True)
    for block in blocks.modules:
        fully_shard(block)
    fully_shard(model)
    float8.float8_scales_hook(model)  # as the run sets it up, before its first step
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    return [p.grad.full_tensor() for p in model.parameters()]


def test_selective_checkpointing_under_float8_all_gathers_keeps_the_gradients():
    """The first step's all-gathers scaled their weights themselves, inside the GPT's own checkpoint: selective
    checkpointing saved those `max`es and the recompute read them as its activations', so fsdp's first step's
    gradients (and every loss after it) were not ddp's."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain, selective = _fsdp_fp8_gradients(False), _fsdp_fp8_gradients(True)
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(a, b) for a, b in zip(plain, selective, strict=True))
