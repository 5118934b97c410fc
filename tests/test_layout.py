"""The layout's rules, read from the source (docs/architecture.md says why each holds):

- harness/ holds job packages only; a job imports a sibling job only through the names the
  sibling's __init__ exports, and the planner imports no other job at all;
- an exported name is never a submodule's name, and every exported name resolves;
- no two modules of strategies/, models/, configs/, harness/ share a file name;
- strategies/ imports no torch at module level, so the registry reads every preset without
  torch, and `runner.py plan` of a zoo model imports none either.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import ROOT, env_for_tests

HARNESS = ROOT / "harness"
JOBS = sorted(p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file())
SHARED = "common"  # what every job may import in full
STANDS_ALONE = "plan"  # imports no other job
HOMES = ("strategies", "models", "configs", "harness")


def _exports(job: str) -> list[str]:
    return list(getattr(importlib.import_module(f"harness.{job}"), "__all__", []))


def _submodules(job: str) -> set[str]:
    return {info.name for info in pkgutil.iter_modules([str(HARNESS / job)])}


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every import in the file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _sibling_violations(path: Path, job: str, exports: dict[str, list[str]]) -> list[str]:
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    problems = []
    for line, module, names in _imports(path):
        parts = module.split(".")
        if parts[0] != "harness":
            continue
        if len(parts) == 1:  # from harness import <job>: the package object, past its exports
            sibling_packages = [n for n in names if n in JOBS and n not in (job, SHARED)]
            problems += [f"{where}:{line} imports the package harness.{n}" for n in sibling_packages]
            continue
        other = parts[1]
        if other in (job, SHARED):
            continue
        if job == SHARED:
            problems.append(f"{where}:{line} imports {module}: common is shared by the jobs and imports none")
        elif job == STANDS_ALONE:
            problems.append(f"{where}:{line} imports {module}: the planner stands alone")
        elif len(parts) > 2 or not names:
            problems.append(f"{where}:{line} imports {module}: import harness.{other}'s exported names instead")
        else:
            hidden = [n for n in names if n not in exports[other]]
            problems += [f"{where}:{line} imports {n} from harness.{other}, which does not export it" for n in hidden]
    return problems


def test_harness_holds_job_packages_only():
    assert sorted(p.name for p in HARNESS.glob("*.py")) == ["__init__.py"]
    assert SHARED in JOBS and STANDS_ALONE in JOBS


def test_jobs_import_siblings_only_through_their_exports():
    exports = {job: _exports(job) for job in JOBS}
    problems = [
        problem
        for job in JOBS
        for path in sorted((HARNESS / job).rglob("*.py"))
        for problem in _sibling_violations(path, job, exports)
    ]
    assert not problems, "\n".join(problems)


def test_the_scan_sees_a_sibling_import_past_the_exports(tmp_path):
    """The rule's own check, on a file that breaks it in each way it can be broken."""
    exports = {job: _exports(job) for job in JOBS}
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from harness.train.loop import built\n"  # a sibling's module, not its exports
        "from harness.train import preflight, seed_everything\n"  # the second is not exported
        "import harness.compare.results\n"
        "from harness import train\n"  # the package object, past its exports
        "from harness.common.units import GIB\n"  # allowed: shared
        "def later():\n    from harness.compare import read_results\n"  # allowed: exported
    )
    problems = _sibling_violations(bad, "report", exports)
    assert [p.split(" ", 1)[1] for p in problems] == [
        "imports harness.train.loop: import harness.train's exported names instead",
        "imports seed_everything from harness.train, which does not export it",
        "imports harness.compare.results: import harness.compare's exported names instead",
        "imports the package harness.train",
    ]
    assert _sibling_violations(bad, STANDS_ALONE, exports)[-1].endswith("the planner stands alone")


@pytest.mark.parametrize("job", JOBS)
def test_exported_names_are_not_submodule_names_and_resolve(job):
    exports = _exports(job)
    assert not set(exports) & _submodules(job), f"harness.{job} exports a name that is also a submodule"
    package = importlib.import_module(f"harness.{job}")
    for name in exports:
        assert getattr(package, name) is not None, name


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for home in HOMES for p in (ROOT / home).rglob("*.py") if p.name != "__init__.py")
    assert not [name for name, count in names.items() if count > 1]


def _module_level_torch_imports(path: Path) -> list[int]:
    """Lines of torch imports that run when the module is imported (TYPE_CHECKING blocks aside)."""
    lines = []
    pending = list(ast.parse(path.read_text(), str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            pending += node.orelse
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            lines.append(node.lineno)
    return lines


def test_strategies_import_no_torch_at_module_level():
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "strategies").rglob("*.py"))
        if (lines := _module_level_torch_imports(path))
    }
    assert not found, f"import torch inside the methods that run: {found}"


def _torch_imported_by(code: str) -> bool:
    probe = f"import sys\n{code}\nprint('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env_for_tests(), cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1] == "True"


def test_the_registry_reads_every_preset_without_torch():
    assert not _torch_imported_by(
        "from strategies.registry import default_registry\n"
        "for entry in default_registry().entries():\n"
        "    entry.plan, entry.description, entry.options, entry.user_options()"
    )


def test_plan_of_a_zoo_model_imports_no_torch():
    assert not _torch_imported_by("import runner\nrunner.main(['plan', 'model=gpt2-124m', 'gpus=8'])")
