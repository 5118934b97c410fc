"""Offload keeps its state in host memory: a plan fits only where the host's GPUs' processes fit the
host's memory, less its reserve (harness/plan/memory/host_memory.py)."""

from __future__ import annotations

import math

import pytest

import runner
from harness.common.hardware import GPUS
from harness.common.units import GB, GIB
from harness.plan.memory.host_memory import HOST_BUFFER_FACTOR
from harness.plan.model.model_shape import PlanError
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.plan_options import check
from harness.plan.predict import plan_all
from harness.plan.recommendation import recommend

OFFLOAD = ("zero2-offload", "zero3-offload", "fsdp-offload")
LLAMA_405B_ON_A_DGX = {"model": "llama3.1-405b", "gpus": 8, "gpu": "H100"}


def _answer(**options):
    cfg = PlanConfig(**options)
    q = question(cfg)
    plans, _ = plan_all(strategy_names(cfg), q, asked=bool(cfg.strategies))
    return q, {p.name: p for p in plans}, recommend(plans, q)


def test_every_card_has_a_cited_host():
    for key, spec in GPUS.items():
        assert spec.host_memory_gib and spec.host_memory_gib > 0, key
        assert "host" in spec.sources, key  # the figure's source, or the assumption it rests on


def test_a_layout_whose_offload_exceeds_the_host_does_not_fit_nor_is_recommended():
    # 405B's zero3-offload keeps about 945 GiB a GPU on the host: 7.4 TiB for one DGX H100's 8 GPUs,
    # whose 2 TB the card's host gives.
    q, plans, answer = _answer(**LLAMA_405B_ON_A_DGX)
    assert q.host is not None and q.host.capacity == 2048 * GIB and q.host.gpus == 8
    for name in OFFLOAD:
        p = plans[name]
        assert p.host_bytes * 8 > q.host.usable and p.host_fits is False and p.fits is False, name
    said = "\n".join(answer.lines)
    assert answer.best is None or plans[answer.best].host_fits is not False, said
    assert "Use zero3-offload with activation_checkpointing=selective" not in said
    assert "of host memory per 8-GPU host" in said and "host_mem_gb=" in said, said


def test_a_host_large_enough_makes_the_offload_fit_again():
    q, plans, _ = _answer(**LLAMA_405B_ON_A_DGX)
    held = plans["zero3-offload"].host_bytes * 8 * HOST_BUFFER_FACTOR  # bytes the host needs, reserve and all
    _, plans, answer = _answer(**LLAMA_405B_ON_A_DGX, host_mem_gb=math.ceil(held / GB) + 1)
    assert plans["zero3-offload"].host_fits is True
    assert answer.best == "zero3-offload", answer.lines
    assert "activation_checkpointing=selective" in answer.lines[1], answer.lines


def test_the_named_host_holds_what_it_was_named_for():
    _, _, answer = _answer(**LLAMA_405B_ON_A_DGX)
    said = "\n".join(answer.lines)
    named = int(said.split("a host of host_mem_gb=")[1].split()[0])
    _, plans, _ = _answer(**LLAMA_405B_ON_A_DGX, host_mem_gb=named)
    assert plans["zero3-offload"].host_fits is True


def test_more_gpus_share_the_state_out_over_more_hosts():
    _, plans, _ = _answer(model="llama3.1-405b", gpus=64, gpu="H100", activation_checkpointing="full")
    assert plans["zero3-offload"].host_fits is True and plans["zero3-offload"].fits is True


def test_a_plan_without_offload_is_not_held_to_the_host():
    _, plans, _ = _answer(model="gpt2-124m", gpus=8, gpu="H100", host_mem_gb=1)
    assert plans["ddp"].host_bytes == 0 and plans["ddp"].fits is True
    assert plans["zero3-offload"].fits is False  # its 124M parameters' state outgrows a 1 GB host


def test_the_table_says_host_where_only_the_host_is_short(capsys):
    code = runner.main(["plan", "model=gpt2-124m", "gpus=8", "host_mem_gb=1", "strategies=[ddp,zero3-offload]"])
    out = capsys.readouterr().out
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("zero3-offload "))
    assert " host " in row, row
    assert "  host: 954 MiB per 8-GPU host" in out, out  # 1 GB
    # The host given, not the card's reference host it replaces.
    assert "(host_mem_gb=, in place of the H100 SXM 80GB's reference host)" in out, out
    assert "reference host; host_mem_gb= for another" not in out, out


@pytest.mark.parametrize(
    "value, says",
    [
        ("0", "host_mem_gb=0.0 must be a positive, finite number"),
        ("-5", "host_mem_gb=-5.0 must be a positive, finite number"),
        ("nan", "host_mem_gb=nan must be a finite number"),
        ("inf", "host_mem_gb=inf must be a finite number"),
        ("lots", "bad value for 'host_mem_gb'"),
    ],
)
def test_a_bad_host_size_is_a_one_line_error(capsys, value, says):
    code = runner.main(["plan", "model=gpt2-124m", f"host_mem_gb={value}"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("parabench: error: ") and says in err, err


def test_a_host_size_that_is_no_number_is_refused():
    with pytest.raises(PlanError, match="host_mem_gb=nan"):
        check(PlanConfig(model="gpt2-124m", host_mem_gb=math.nan))


def test_where_no_host_on_any_count_holds_it_the_search_says_so():
    from harness.plan.search.what_fits import what_fits

    q = question(PlanConfig(model="gpt2-124m", gpus=8, host_mem_gb=0.001))  # 1 MB: no offload's state fits it
    said = what_fits(q, 8, ["zero3-offload"]).lines(q.gpus)
    assert len(said) == 1 and said[0].startswith("No layout the planner knows fits on up to 1,024 GPUs"), said
    assert "of host memory per 8-GPU host" in said[0] and "host_mem_gb=" in said[0], said
