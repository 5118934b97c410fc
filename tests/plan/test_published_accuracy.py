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
    accuracy_line,
    layout_kinds,
    scale_of_nodes,
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
    "scales": {SCALES[1]: {"runs": 270, "median_abs_error": 0.083, "median_ratio": 0.96}},
    "families": {"Hopper (H100, H200)": {"runs": 433, "median_abs_error": 0.071, "median_ratio": 1.003}},
    "sweep": {
        "what": "one team's sweep",
        "kinds": {TP_ACROSS: {"runs": 186, "median_abs_error": 1.105, "median_ratio": 2.105}},
    },
}


def test_the_line_quotes_the_buckets_of_the_layout_its_scale_and_its_card(monkeypatch):
    monkeypatch.setattr(published_accuracy, "published_figures", lambda: FIGURES)
    four_nodes = SimpleNamespace(per_domain=8, nodes=4)
    across = accuracy_line(SimpleNamespace(tp=16, pp=1, cp=1), four_nodes, GPUS["H100"])
    assert "TP across nodes 21.5% (only 8 runs, 22% fast at the median)" in across
    assert "on 2-8 nodes 8.3% (270 runs, 4% slow at the median)" in across
    assert "on Hopper (H100, H200) 7.1% (433 runs, no lean)" in across
    assert "in one team's sweep, TP across nodes 110.5% (186 runs, 2.1x fast at the median)" in across
    assert DATA_PARALLEL not in across
    # A card given by its figures alone belongs to no family the benchmark measured.
    custom = replace(GPUS["H100"], name="my-card")
    plain = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), four_nodes, custom)
    assert "data parallel only 7.0% (400 runs" in plain and "Hopper" not in plain and "sweep" not in plain


def test_the_shipped_figures_cover_every_kind_and_scale():
    figures = published_accuracy.published_figures()
    assert set(figures["kinds"]) == set(KINDS) and set(figures["scales"]) == set(SCALES)
    assert all(0 <= f["median_abs_error"] < 1 and f["runs"] > 0 for f in figures["kinds"].values())


def test_the_recommendation_says_it_under_its_first_line():
    q = question(PlanConfig(model="llama3.1-8b", gpu="H100", gpus=16, strategies=["fsdp-tp"]))
    plans, _ = plan_all(["fsdp-tp"], q)
    lines = recommend(plans, q).lines
    assert lines[0].startswith("Use fsdp-tp")
    (line,) = [x for x in lines if x.startswith("How close plans like it have come")]
    assert line == accuracy_line(plans[0].layout, q.topology, q.gpu)
    assert TP_INSIDE in line and "on 2-8 nodes" in line and "Hopper (H100, H200)" in line


@pytest.mark.parametrize("card", ["GB200", "MI300X", "V100-16"])
def test_each_new_family_is_named(card):
    line = accuracy_line(SimpleNamespace(tp=1, pp=1, cp=1), SimpleNamespace(per_domain=8, nodes=1), GPUS[card])
    assert published_accuracy.card_family(GPUS[card]) in line
