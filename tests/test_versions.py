"""The start-up check holds a user to pyproject.toml's ranges, not to the dev extra's pins, and the
dev extra pins the transformers release accelerate-fsdp-tp names."""

from __future__ import annotations

import pytest

from harness.common import versions
from strategies.accelerate.fsdp_tp_mode import LAST_WITH_REPLICATE_PARALLEL
from tests.helpers import ROOT

DECLARED = [
    'transformers==5.0.0; extra == "dev"',  # first: the pin must not win by its place
    'transformers<6,>=5.0; extra == "hf"',
    "torch<2.14,>=2.11",
    'pytest>=8; extra == "dev"',
]


@pytest.fixture
def declared(monkeypatch):
    monkeypatch.setattr(versions, "requires", lambda name: DECLARED)


def test_the_ranges_are_the_users_not_the_dev_pins(declared):
    ranges = {name: str(r.specifier) for name, r in versions.tested_ranges().items()}
    assert ranges == {"transformers": "<6,>=5.0", "torch": "<2.14,>=2.11"}


@pytest.mark.parametrize("installed, refused", [("5.24.0", False), ("5.0.0", False), ("4.57.6", True)])
def test_a_release_inside_the_range_runs_though_the_tests_pin_another(declared, monkeypatch, installed, refused):
    monkeypatch.setattr(versions, "version", lambda name: installed if name == "transformers" else "2.13.0")
    if refused:
        refusal = r"^transformers 4\.57\.6 is installed, .*: pip install 'transformers<6,>=5.0'"
        with pytest.raises(versions.VersionError, match=refusal):
            versions.check_versions(env={})
    else:
        versions.check_versions(env={})


def test_the_dev_extra_pins_the_transformers_release_accelerate_fsdp_tp_asks_for():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"transformers=={LAST_WITH_REPLICATE_PARALLEL}" in extras["dev"]
