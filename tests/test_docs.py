"""The README and docs: a README a user reads in one go, whose strategy table is the registry's,
documents that speak of the project alone (no project history, no path outside the repository),
and links that lead somewhere."""

from __future__ import annotations

import re

import pytest

from harness.train.list_cli import strategy_table
from strategies.registry import builtin_registry
from tests.helpers import ROOT

README = ROOT / "README.md"
DOCUMENTS = sorted([README, *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.md")])
# Words about how the project was made rather than what it does, and paths of the machine it was made on.
HISTORY = re.compile(r"session|lent GPU|issue [0-9]|\.\./shared|/work/", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_at_most_150_lines():
    assert len(README.read_text().splitlines()) <= 150


def test_readme_strategy_table_is_the_registrys():
    """Regenerate it with `python runner.py list --markdown` when a backend is added."""
    text = README.read_text()
    start, end = text.index("<!-- strategies:"), text.index("<!-- end strategies -->")
    table = [line for line in text[start:end].splitlines() if line.startswith("|")]
    assert table == strategy_table(builtin_registry())


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_speak_of_the_project_alone(document):
    found = [f"{i}: {line}" for i, line in enumerate(document.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_to_files_of_the_repository(document):
    for target in LINK.findall(document.read_text()):
        path = target.split("#")[0]
        assert not re.match(r"[a-z]+:", path) and not path.startswith("/"), f"{target}: outside the repository"
        resolved = (document.parent / path).resolve()
        assert resolved.is_relative_to(ROOT), f"{target}: outside the repository"
        assert resolved.exists(), f"{target}: no such file"
