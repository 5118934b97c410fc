"""The checkpoint keys and shapes of every torch mesh preset at world size 4 (CPU, gloo), held to a
golden file: a preset that renamed or reshaped what it saves would stop loading the checkpoints the
others write (fsdp, hsdp, fsdp-tp, ddp-tp, zero1-tp and fsdp-cp load each other's; fsdp-pp's carries
the tied head's copy and its optimizer state besides).

    PARABENCH_UPDATE_GOLDEN=1 python -m pytest tests/strategies/test_dcp_keys.py

writes the file afresh from the run (review its diff before committing it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded
from tests.strategies.dcp_keys_worker import PRESETS

pytestmark = pytest.mark.timeout(600)

GOLDEN = Path(__file__).parent / "golden" / "dcp_keys_world4.json"
UPDATE_ENV = "PARABENCH_UPDATE_GOLDEN"
# Saved by fsdp-pp alone: the last stage's copy of the tied embedding, with its optimizer state.
TIED_COPY_STATE = {f"optimizer.state.lm_head.weight.{key}" for key in ("exp_avg", "exp_avg_sq", "step")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("dcp_keys")
    worker = ROOT / "tests" / "strategies" / "dcp_keys_worker.py"
    cmd = forked_torchrun(4, worker, str(out / "keys.json"), str(out / "checkpoints"), backends=PRESETS)
    proc = run_bounded(cmd, timeout=500, env=env_for_tests())
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    keys = json.loads((out / "keys.json").read_text())
    failed = {name: result["error"] for name, result in keys.items() if "error" in result}
    assert not failed, failed
    if os.environ.get(UPDATE_ENV) == "1":
        GOLDEN.write_text(_one_key_a_line(keys))
    return keys


def _one_key_a_line(keys: dict[str, dict]) -> str:
    presets = []
    for name in sorted(keys):
        lines = [f"  {json.dumps(key)}: {json.dumps(shape)}" for key, shape in sorted(keys[name].items())]
        presets.append(f"{json.dumps(name)}: {{\n" + ",\n".join(lines) + "\n}")
    return "{\n" + ",\n".join(presets) + "\n}\n"


def test_every_preset_saves_the_keys_and_shapes_of_the_golden_file(saved):
    golden = json.loads(GOLDEN.read_text())
    assert sorted(saved) == sorted(golden)
    for name, keys in golden.items():
        assert saved[name] == keys, name


def test_the_presets_that_load_each_other_save_the_same_keys(saved):
    fsdp = saved["fsdp"]
    for name in ("fsdp-grad-op", "fsdp-offload", "hsdp", "fsdp-tp", "ddp-tp", "zero1-tp", "fsdp-cp"):
        assert saved[name] == fsdp, name
    pipelined = saved["fsdp-pp"]
    assert set(pipelined) - set(fsdp) == TIED_COPY_STATE
    assert {key: pipelined[key] for key in fsdp} == fsdp
