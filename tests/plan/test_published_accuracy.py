"""The plan quotes how close it has come to published runs of the layout it recommends: the
kinds, scales and card families of bench/results/plan_vs_published.md, read from the figures the
benchmark writes (harness/plan/published_accuracy.json)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from harness.common.hardware import GPUS
from harness.plan import published_accuracy
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_all
from harness.plan.published_accuracy import (
    CONTEXT,
    DATA_PARALLEL,
    KINDS,
    PIPELINE,
    SCALES,
    TP_ACROSS,
    TP_INSIDE,
    WORK_BUCKETS,
    accuracy_line,
    layout_kinds,
    plan_work,
    scale_of_nodes,
    work_bucket_of,
)
from harness.plan.recommendation import recommend


def test_a_layout_counts_under_each_kind_it_has():
    assert layout_kinds(1, 1, 1, 8) == (DATA_PARALLEL,)
    assert layout_kinds(8, 4, 2, 8) == (TP_INSIDE, PIPELINE, CONTEXT)
    assert layout_kinds(16, 1, 1, 8) == (TP_ACROSS,)
    assert layout_kinds(16, 1, 1, 72) == (TP_INSIDE,)  # inside an NVL72 rack's NVLink domain
    assert [scale_of_nodes(n) for n in (1, 8, 9, 64, 65)] == [SCALES[0], SCALES[1], SCALES[2], SCALES[2], SCALES[3]]


FIGURES = {
    "kinds": {
        DATA_PARALLEL: {"runs": 400, "median_abs_error": 0.07, "median_ratio": 1.03},
        TP_ACROSS: {"runs": 8, "median_abs_error": 0.215, "median_ratio": 1.215},
    },
    "kinds_by_scale": {
        DATA_PARALLEL: {
            SCALES[1]: {"runs": 120, "median_abs_error": 0.068, "median_ratio": 1.054},
            SCALES[3]: {"runs": 14, "median_abs_error": 0.191, "median_ratio": 1.191},
        },
        TP_ACROSS: {SCALES[1]: {"runs": 8, "median_abs_error": 0.215, "median_ratio": 1.215}},
    },
    "work": {"w < 2^20": {"runs": 293, "median_abs_error": 1.109, "median_ratio": 2.109}},
    "families": {"Hopper (H100, H200)": {"runs": 433, "median_abs_error": 0.071, "median_ratio": 1.003}},
    "sweep": {
        "what": "one team's sweep",
        "kinds": {TP_ACROSS: {"runs": 186, "median_abs_error": 1.105, "median_ratio": 2.105}},
    },
}


def test_the_line_quotes_each_kind_at_the_layouts_scale_its_card_and_the_sweep(monkeypatch):
    monkeypatch.setattr(published_accuracy, "published_figures", lambda: FIGURES)
    four_nodes = SimpleNamespace(per_domain=8, nodes=4)
    across = accuracy_line(SimpleNamespace(tp=16, pp=1, cp=1), four_nodes, GPUS["H100"])
    assert "TP across nodes on 2-8 nodes 21.5% (only 8 runs, 22% fast at the median)" in across
    assert "on Hopper (H100, H200) 7.1% (433 runs, no lean)" in across
    assert "in one team's sweep, TP across nodes 110.5% (186 runs, 2.1x fast at the median)" in across
    assert DATA_PARALLEL not in across
    # A kind and a scale apart would hide a small bucket: data parallelism past 64 nodes is its own.
    many = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), SimpleNamespace(per_domain=8, nodes=128), GPUS["H100"])
    assert "data parallel only on more than 64 nodes 19.1% (only 14 runs, 19% fast at the median)" in many
    # A kind no published run had at this scale says so, and quotes the kind on any scale.
    wide = accuracy_line(SimpleNamespace(tp=16, pp=1, cp=1), SimpleNamespace(per_domain=8, nodes=16), GPUS["H100"])
    assert "TP across nodes, none published on 9-64 nodes: on any scale 21.5% (only 8 runs" in wide
    # A card given by its figures alone belongs to no family the benchmark measured.
    custom = replace(GPUS["H100"], name="my-card")
    plain = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), four_nodes, custom)
    assert "data parallel only on 2-8 nodes 6.8% (120 runs" in plain and "Hopper" not in plain and "sweep" not in plain


def test_a_small_model_quotes_its_work_per_gpu_per_layer_op(monkeypatch):
    monkeypatch.setattr(published_accuracy, "published_figures", lambda: FIGURES)
    one_node = SimpleNamespace(per_domain=8, nodes=1)
    # GPT-2 124M at micro-batch 1 of 1,024 tokens, tp 1: 2^19.6 elements a layer op, the bucket planned 2.1x fast.
    small = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), one_node, GPUS["H100"], 1 * 1024 * 768)
    assert "at its work per GPU per layer op, w < 2^20 (micro-batch x seq x width / tp = 2^19.6) 110.9%" in small
    assert "(293 runs, 2.1x fast at the median)" in small
    # A bucket the figures lack, and a model without transformer sizes, quote no work.
    large = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), one_node, GPUS["H100"], 2.0**25)
    assert "work per GPU" not in large and "work per GPU" not in accuracy_line(
        SimpleNamespace(tp=1, pp=1, cp=1), one_node, GPUS["H100"], None
    )
    assert [work_bucket_of(w) for w in (1.0, 2.0**20, 2.0**23, 2.0**24)] == [b[2] for b in WORK_BUCKETS]
    assert plan_work(2, 4096, SimpleNamespace(width=4096), 8) == 2**22 and plan_work(2, 4096, None, 8) is None


def test_the_shipped_figures_cover_every_kind_and_scale():
    figures = published_accuracy.published_figures()
    assert set(figures["kinds"]) == set(figures["kinds_by_scale"]) == set(KINDS)
    assert set(figures["kinds_by_scale"][DATA_PARALLEL]) == set(SCALES)
    assert set(figures["work"]) == {name for _, _, name in WORK_BUCKETS}
    assert all(0 <= f["median_abs_error"] < 1 and f["runs"] > 0 for f in figures["kinds"].values())


def test_the_recommendation_says_it_under_its_first_line():
    q = question(PlanConfig(model="llama3.1-8b", gpu="H100", gpus=16, strategies=["fsdp-tp"]))
    plans, _ = plan_all(["fsdp-tp"], q)
    lines = recommend(plans, q).lines
    assert lines[0].startswith("Use fsdp-tp")
    (line,) = [x for x in lines if x.startswith("How close plans like it have come")]
    work = plan_work(plans[0].micro_batch, q.seq_len, q.shape.dims, plans[0].layout.tp)
    assert line == accuracy_line(plans[0].layout, q.topology, q.gpu, work)
    assert f"{TP_INSIDE} on 2-8 nodes" in line and "Hopper (H100, H200)" in line and "work per GPU" in line


@pytest.mark.parametrize("card", ["GB200", "MI300X", "V100-16"])
def test_each_new_family_is_named(card):
    line = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), SimpleNamespace(per_domain=8, nodes=1), GPUS[card])
    assert published_accuracy.card_family(GPUS[card]) in line
