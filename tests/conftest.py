import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        help="also run the tests marked `extended` (a guarantee repeated for another strategy, launcher, model, "
        "precision or format, beyond what every change needs)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`./parabench test` stays within the time every change can pay; `./parabench test --all` runs the
    `extended` tests too (every change to layouts runs it before it lands)."""
    if config.getoption("--all"):
        return
    skip = pytest.mark.skip(reason="extended: run with ./parabench test --all")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The `single` run every equivalence test compares against (trained once per session, for
    every xdist worker)."""
    from tests.helpers import read_run, trained_once

    return read_run(trained_once(tmp_path_factory.getbasetemp(), "single"))


@pytest.fixture(scope="session")
def llama_reference_run(tmp_path_factory):
    """`single` on NANO's data with tests.helpers.LLAMA_4, what the pipelines of it compare against."""
    from tests.helpers import LLAMA_4, made_once, read_run, train

    made = made_once(tmp_path_factory.getbasetemp(), "llama-single", lambda out: train(out, "single", extra=LLAMA_4))
    return read_run(made)
