"""bench/kernel_table_vs_plan.py: a table's figures against the planner's model without it."""

from __future__ import annotations

import json

import pytest

from bench.kernel_table_vs_plan import main, report
from harness.common.hardware import GPUS
from harness.plan.speed.attention import attention_tflops
from harness.plan.speed.gemm import _modelled
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL


def _table(scale: float) -> dict:
    gpu = GPUS["H200"]
    shapes = [(512, 128, 1024), (8192, 8192, 8192)]
    return {
        "source": "made up",
        "host_s_per_kernel": {kind: 2 * rate for kind, rate in HOST_S_PER_KERNEL.items()},
        "memory_efficiency": 0.5,
        "matmuls": [[m, n, k, scale * _modelled(m, n, k, gpu, "bf16", 1, 1.0)] for m, n, k in shapes],
        "attention": {"cudnn": [[4096, 128, scale * attention_tflops(gpu, "cudnn", 128, 4096)]]},
    }


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_each_figure_is_held_against_the_model(scale):
    text = report(_table(scale), "H200")
    assert f"| 2^26-2^28 | 1 | {scale:.3f} | {scale:.3f} | {scale:.3f} |" in text
    assert f"| 2^40-2^42 | 1 | {scale:.3f} |" in text
    assert text.rstrip().endswith(f"| {scale:.2f} |")  # the attention point's measured / planned
    eager_us = HOST_S_PER_KERNEL["eager"] * 1e6
    assert f"| eager | {2 * eager_us:.1f} us | {eager_us:.1f} us |" in text


def test_an_unreadable_table_or_unknown_card_is_one_line(tmp_path, capsys):
    bad = tmp_path / "H200.json"
    bad.write_text("{")
    with pytest.raises(SystemExit):
        main([str(bad)])
    assert "cannot read a kernel table" in capsys.readouterr().err
    good = tmp_path / "Z9.json"
    good.write_text(json.dumps(_table(1.0)))
    with pytest.raises(SystemExit):
        main([str(good)])
    assert "unknown card 'Z9'" in capsys.readouterr().err
