"""The DeepSpeed config parabench hands deepspeed.initialize (zero1-3, and what Accelerate passes on
for accelerate-zero1-3) equals the one bench/handwritten/zero.py builds, on the values DeepSpeed
uses, except for the differences bench/deepspeed_parity.py documents with their reasons.

One short run per strategy and precision (world size 1, in one process: a few seconds each),
shared by every check through a module-scoped fixture.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench import deepspeed_parity as parity
from tests.helpers import NANO, ROOT, run_cli

STRATEGIES = ("zero1", "zero2", "zero3", "accelerate-zero1", "accelerate-zero2", "accelerate-zero3")
# bf16 is what the GPU benchmark runs; fp32 covers the other precision branch of both builders.
CASES = [(name, "bf16") for name in STRATEGIES] + [("zero2", "fp32"), ("accelerate-zero2", "fp32")]
# On every change one builder path each, parabench's own and Accelerate's; the rest under --all.
EVERY_CHANGE = {("zero3", "bf16"), ("accelerate-zero2", "bf16")}
SELECTED_CASES = [case if case in EVERY_CHANGE else pytest.param(*case, marks=pytest.mark.extended) for case in CASES]

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("deepspeed", "accelerate", "transformers")),
        reason="needs deepspeed, accelerate and transformers",
    ),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def differences(tmp_path_factory):
    """differences(strategy, precision) -> {setting: (parabench, zero.py)}, each run trained once."""
    found: dict[tuple[str, str], dict] = {}

    def get(name: str, precision: str) -> dict:
        if (name, precision) not in found:
            out_dir = tmp_path_factory.mktemp(f"{name}-{precision}")
            # The config is written at setup; two steps are enough to finish the run cleanly.
            proc = run_cli(
                [
                    "train",
                    f"strategy={name}",
                    f"precision={precision}",
                    f"out_dir={out_dir}",
                    *NANO,
                    "steps=2",
                    "log_every=1",
                ],
                timeout=300,
            )
            assert proc.returncode == 0, (
                f"{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
            found[(name, precision)] = parity.run_differences(Path(out_dir))
        return found[(name, precision)]

    return get


@pytest.mark.parametrize("name, precision", SELECTED_CASES)
def test_config_differs_from_the_handwritten_loop_only_where_documented(differences, name, precision):
    undocumented = {
        path: values for path, values in differences(name, precision).items() if not parity.is_documented(path)
    }
    assert not undocumented, (
        f"{name} ({precision}) hands DeepSpeed settings zero.py does not, with no reason in "
        f"bench/deepspeed_parity.py DOCUMENTED_DIFFERENCES: {undocumented}"
    )


@pytest.mark.extended  # it needs every case's run
def test_every_documented_difference_is_one_that_occurs(differences):
    """A documented difference that no run shows any more is stale: remove it."""
    seen = {path for case in CASES for path in differences(*case)}
    stale = [
        key
        for key in parity.DOCUMENTED_DIFFERENCES
        if not any(path == key or path.startswith(key + ".") for path in seen)
    ]
    assert not stale, f"documented but never seen: {stale}"


@pytest.mark.parametrize("name, precision", SELECTED_CASES)
def test_the_step_shaping_settings_agree(differences, name, precision):
    """Precision, clipping, batch and stage are never among the differences (documented or not)."""
    shaping = [
        path
        for path in differences(name, precision)
        if path.split(".")[0]
        in (
            "bf16",
            "fp16",
            "gradient_clipping",
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "communication_data_type",
        )
        or path == "zero_optimization.stage"
    ]
    assert not shaping, f"{(name, precision)}: {shaping}"


def test_the_benchmarks_page_shows_every_documented_difference():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [key for key in parity.DOCUMENTED_DIFFERENCES if f"`{key}`" not in page]
    assert not missing, (
        f"docs/benchmarks.md does not list {missing}: paste `python bench/deepspeed_parity.py --documented`"
    )
