"""DeepSpeed's shared-memory op stays unbuilt on a CPU: its torch backend finds it unavailable."""

from __future__ import annotations

import os

import pytest

from strategies.deepspeed import DeepSpeedStrategy

pytestmark = pytest.mark.skipif(
    DeepSpeedStrategy.unavailable_reason() is not None, reason=str(DeepSpeedStrategy.unavailable_reason())
)


def test_the_torch_backend_gets_no_op_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    from strategies.deepspeed_cpu_op import SHARED_MEMORY_BUILDER, skip_cpu_comm_op

    name = get_accelerator().create_op_builder(SHARED_MEMORY_BUILDER).NAME
    # Restored afterwards: the mark is this process's, and the test's alone.
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, name, deepspeed.ops.__compatible_ops__.get(name, False))
    skip_cpu_comm_op()
    assert deepspeed.ops.__compatible_ops__[name] is False
    assert build_shm_op() is None
    assert not os.path.exists(tmp_path / "extensions")
