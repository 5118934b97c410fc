import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The `single` run every equivalence test compares against (trained once per session)."""
    from tests.helpers import train

    return train(tmp_path_factory.mktemp("single"), "single")
