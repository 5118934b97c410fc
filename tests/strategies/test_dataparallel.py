"""`dataparallel` (strategies/dataparallel.py): listed unavailable with its reason where fewer than
2 GPUs are visible; on the CPU, what it hands DataParallel (its replicas, their autocast and the
mean over an uneven split) checked with DataParallel's scatter, threads and gather played on the
CPU; on 2 GPUs (marked gpu), the same loss curve as `single` in fp32.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from harness.compare.compare_cli import _skip_reason
from harness.train import device_info, list_cli
from harness.train.distributed import DistEnv
from harness.train.metrics import StepMetrics
from models.zoo import build_model
from strategies.base import RunContext, StrategyError
from strategies.dataparallel import DataParallelStrategy, mean_loss_over_gpus
from strategies.registry import default_registry
from tests.helpers import max_rel_diff, train

CPU = torch.device("cpu")


def _ctx(device: torch.device = CPU, **config) -> RunContext:
    return RunContext(
        rank=0,
        world_size=1,
        local_rank=0,
        device=device,
        precision="fp32",
        micro_batch=5,
        grad_accum=1,
        grad_clip=1.0,
        config=SimpleNamespace(**config),
    )


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs dataparallel needs")
def test_listed_unavailable_with_the_reason(capsys):
    entry = default_registry().get("dataparallel")
    visible = torch.cuda.device_count()
    seen = "1 GPU is" if visible == 1 else f"{visible} GPUs are"
    assert entry.unavailable_reason.endswith(f"{seen} visible here: run it where 2 or more are")
    assert list_cli.main([]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["dataparallel"])
    assert "[unavailable: torch.nn.DataParallel splits each batch over the GPUs of one process" in line
    # The compare lists it as skipped, with the same reason, instead of running it.
    assert _skip_reason(default_registry(), "dataparallel", "cpu") == f"unavailable: {entry.unavailable_reason}"


def test_two_visible_gpus_make_it_available_for_cuda_runs_alone(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert DataParallelStrategy.unavailable_reason() is None
    assert DataParallelStrategy.unsupported_reason("cuda", {}) is None
    assert "on a CPU it would run as single" in DataParallelStrategy.unsupported_reason("cpu", {})
    strategy = default_registry().create("dataparallel", _ctx(torch.device("cuda", 0)))
    assert strategy.devices() == [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_its_mfu_counts_every_gpu_it_drives(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device_info, "peak_flops", lambda device, precision: 1e12)
    cuda0 = torch.device("cuda", 0)
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=cuda0)

    def metrics(devices: list[torch.device]) -> StepMetrics:
        return StepMetrics(
            env,
            data_parallel_size=1,
            counts_loss=True,
            out_dir=tmp_path,
            tokens_per_step=1024,
            flops_per_token=6e6,
            precision="fp32",
            timing_warmup=0,
            devices=devices,
        )

    driven = DataParallelStrategy(_ctx(cuda0)).devices()
    assert metrics(driven).job_peak_flops == 2 * metrics([]).job_peak_flops == 2e12


def test_declared_one_process_torch_checkpoints_and_planned_as_threads():
    registry = default_registry()
    entry = registry.get("dataparallel")
    assert entry.one_process and registry.get("single").one_process
    # ddp and fsdp reuse single's verbs by inheritance, not its one process.
    assert not registry.get("ddp").one_process and not registry.get("fsdp").one_process
    assert entry.cls.checkpoint_format == registry.get("single").cls.checkpoint_format == "torch"
    assert (entry.plan.engine, entry.plan.stage, entry.plan.replicas) == ("torch", 0, "threads")


def test_compile_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(StrategyError, match="cannot compile its replicas: use compile=false, or ddp") as err:
        default_registry().create("dataparallel", _ctx(compile=True))
    assert "\n" not in str(err.value)


class ThreadsOnTheCPU(torch.nn.Module):
    """torch.nn.DataParallel's forward, played on the CPU: the micro-batch split as its scatter
    splits it (Tensor.chunk), each chunk run by the same module in a thread of its own that
    starts, as DataParallel's threads do, with autocast on at the thread's default type (fp16),
    and the outputs concatenated as its gather does."""

    def __init__(self, module: torch.nn.Module, device_ids: list[int | None]):
        super().__init__()
        self.module, self.replicas = module, len(device_ids)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        chunks = list(zip(inputs.chunk(self.replicas), targets.chunk(self.replicas), strict=True))
        outputs: list[torch.Tensor | None] = [None] * len(chunks)
        enabled = torch.is_autocast_enabled("cpu")

        def run(i: int, x: torch.Tensor, y: torch.Tensor) -> None:
            with torch.autocast("cpu", dtype=torch.float16, enabled=enabled):
                outputs[i] = self.module(x, y)

        threads = [threading.Thread(target=run, args=(i, x, y)) for i, (x, y) in enumerate(chunks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return torch.cat(outputs)


def _nano() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("gpt-nano")


def test_mean_over_an_uneven_split_is_the_single_process_loss_and_gradient(monkeypatch):
    monkeypatch.setattr(torch.nn, "DataParallel", ThreadsOnTheCPU)
    rows = torch.randint(0, 128, (5, 17), generator=torch.Generator().manual_seed(1))
    inputs, targets = rows[:, :-1], rows[:, 1:]
    reference, model = _nano(), _nano()
    expected = reference(inputs, targets)
    expected.backward()
    loss = mean_loss_over_gpus(model, [CPU, CPU], None)(inputs, targets)  # rows split 3 + 2
    loss.backward()
    # A plain mean of the two chunks' losses would be off by (3 - 2) / 5 of their difference.
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for (name, want), got in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_each_replica_computes_in_the_runs_low_precision(monkeypatch):
    monkeypatch.setattr(torch.nn, "DataParallel", ThreadsOnTheCPU)
    seen: list[torch.dtype] = []
    model = _nano()
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_autocast_dtype("cpu")))
    strategy = DataParallelStrategy(_ctx())
    rows = torch.randint(0, 128, (4, 17))
    # The loop's context (none: the replicas set their own), and an autocast that DataParallel's
    # threads would take up at their default type, fp16.
    for outer in (strategy.autocast, lambda: torch.autocast("cpu", dtype=torch.bfloat16)):
        for dtype in (torch.bfloat16, torch.float16):
            seen.clear()
            with outer():
                mean_loss_over_gpus(model, [CPU, CPU], dtype)(rows[:, :-1], rows[:, 1:])
            assert seen == [dtype, dtype]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA devices")
def test_matches_single_on_every_gpu(tmp_path):
    cuda = ["device=cuda", "precision=fp32"]
    _, reference = train(tmp_path / "single", "single", extra=cuda)
    summary, rows = train(tmp_path / "dataparallel", "dataparallel", extra=cuda)
    deviation = max_rel_diff(rows, reference)
    print(f"dataparallel on {torch.cuda.device_count()} GPUs: largest relative loss deviation = {deviation:.2e}")
    assert deviation < 1e-4  # fp32: the split changes only the order of the sums
    assert summary["world_size"] == 1 and summary["devices_per_process"] == torch.cuda.device_count()
    assert summary["peak_mem_allocated_bytes"] > 0
