"""The strategy registry: names, errors, and third-party plugins by entry point."""

from __future__ import annotations

import textwrap

import pytest
import torch

from strategies.base import RunContext, StrategyError
from strategies.registry import StrategyRegistry, default_registry, registry_of
from strategies.single import SingleDeviceStrategy, started_more_than_one
from tests.helpers import env_for_tests, run_cli

TORCH_NAMES = {
    "single",
    "ddp",
    "dataparallel",
    "fsdp",
    "fsdp-grad-op",
    "fsdp-offload",
    "hsdp",
    "fsdp-tp",
    "ddp-tp",
    "zero1-tp",
    "fsdp-pp",
    "fsdp-cp",
    "fsdp-ep",
    "ddp-ep",
}
DEEPSPEED_NAMES = {
    "zero1",
    "zero2",
    "zero3",
    "zero2-offload",
    "zero3-offload",
    "zero3-hpz",
    "zero3-zeropp",
    "zero1-pp",
    "zero1-ep",
    "zero2-ep",
}
ACCELERATE_NAMES = {
    "accelerate-ddp",
    "accelerate-fsdp",
    "accelerate-hsdp",
    "accelerate-fsdp-tp",
    "accelerate-zero1",
    "accelerate-zero2",
    "accelerate-zero3",
}


def _ctx() -> RunContext:
    return RunContext(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=1,
        grad_accum=1,
        grad_clip=1.0,
    )


def test_builtin_names_are_exactly_the_documented_set():
    assert set(default_registry().names()) == TORCH_NAMES | DEEPSPEED_NAMES | ACCELERATE_NAMES


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(StrategyError) as err:
        default_registry().get("zero4")
    message = str(err.value)
    assert "zero4" in message and "single" in message and "fsdp" in message and "\n" not in message


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(StrategyError, match="bucket_cap_mb"):
        default_registry().create("ddp", _ctx(), bucket_size=3)


def test_compares_per_strategy_section_given_to_one_run_says_how_the_run_takes_it():
    with pytest.raises(StrategyError) as err:
        default_registry().check_options("ddp", {"ddp": {"bucket_cap_mb": 2}})
    assert str(err.value).endswith("a run of 'ddp' takes its options bare: strategy_options.bucket_cap_mb=2")
    with pytest.raises(StrategyError, match="a run of 'ddp' does not read another strategy's: leave strategy_options"):
        default_registry().check_options("ddp", {"fsdp": {"reshard_after_forward": False}})


def test_one_class_several_names_with_preset_options():
    registry = default_registry()
    assert registry.get("fsdp").cls is registry.get("fsdp-grad-op").cls
    assert registry.get("fsdp-grad-op").options == {
        "engine": "fsdp",
        "mesh_dims": "shard",
        "reshard_after_forward": False,
        "cpu_offload": False,
    }


@pytest.mark.parametrize(
    "name, options, fixed",
    [
        ("zero1", {"stage": 3}, "stage=1"),
        ("zero2", {"offload_optimizer": True}, "offload_optimizer=False"),
        ("fsdp", {"cpu_offload": True}, "cpu_offload=False"),
    ],
)
def test_what_a_name_means_cannot_be_overridden(name, options, fixed):
    """Results under a name mean one thing: zero1 with stage=3 would be ZeRO-3 reported as zero1."""
    with pytest.raises(StrategyError, match=f"strategy '{name}' means {fixed}"):
        default_registry().create(name, _ctx(), **options)
    assert set(options).isdisjoint(default_registry().get(name).user_options())


def test_list_shows_the_options_a_run_may_set():
    proc = run_cli(["list"], timeout=60)
    lines = proc.stdout.splitlines()
    ddp_options = lines[lines.index(next(line for line in lines if line.strip().startswith("ddp "))) + 1]
    assert "strategy_options: bucket_cap_mb=25.0, find_unused_parameters=false" in ddp_options
    zero1_options = lines[lines.index(next(line for line in lines if line.strip().startswith("zero1 "))) + 1]
    assert zero1_options.split() == ["strategy_options:", "cpu_adam=null"]


def test_list_calls_a_strategy_its_device_cannot_run_unavailable_there_with_why():
    """zero3-zeropp's quantization kernels run on GPUs only: list says so on a CPU, as the compare skips it."""
    from harness.train.list_cli import status

    entry = default_registry().get("zero3-zeropp")
    if entry.unavailable_reason:
        pytest.skip(entry.unavailable_reason)
    assert status(entry, "cpu").startswith("unavailable on this device (cpu): DeepSpeed's ZeRO++ quantization kernels")
    assert status(entry, "cuda") == "available" == status(default_registry().get("zero3-hpz"), "cpu")


def test_missing_dependency_is_listed_with_reason():
    class NeedsMissing(SingleDeviceStrategy):
        @classmethod
        def unavailable_reason(cls):
            return "needs the package 'nonexistent': pip install nonexistent"

    registry = StrategyRegistry()
    registry.register("needs-missing", NeedsMissing)
    assert registry.names() == ["needs-missing"] and registry.available_names() == []
    with pytest.raises(StrategyError, match="unavailable here: needs the package"):
        registry.create("needs-missing", _ctx())


def test_a_plugin_module_whose_dependency_is_missing_is_not_called_a_wrong_path(tmp_path, monkeypatch):
    """PARABENCH_PLUGINS found the module: the line names what it imports, not the path the user gave."""
    (tmp_path / "needs_dep_plugin.py").write_text("import parabench_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StrategyError, match="found but failed to import .*'parabench_no_such_dependency'") as caught:
        registry_of(["needs_dep_plugin"])
    assert "give an import path" not in str(caught.value)
    with pytest.raises(StrategyError, match="'no_such_plugin', which cannot be imported .*give an import path"):
        registry_of(["no_such_plugin"])
    # A file's path for the module: the line writes it as the module path it takes.
    with pytest.raises(StrategyError, match=r"give an import path on sys.path, such as tests.strategies.toy_backend$"):
        registry_of(["tests/strategies/toy_backend.py"])


def test_cli_unknown_strategy_is_one_line():
    proc = run_cli(["train", "strategy=nope", "steps=1"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown strategy 'nope'" in proc.stderr


def test_a_one_process_strategy_started_as_two_is_one_line_before_any_worker():
    proc = run_cli(["train", "strategy=single", "nproc=2", "steps=1"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"parabench: error: {started_more_than_one('single', 2)}\n"


def _install_plugin(tmp_path, entry_value: str, module_source: str):
    (tmp_path / "myplugin.py").write_text(textwrap.dedent(module_source))
    dist = tmp_path / "myplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[parabench.strategies]\n{entry_value}\n")
    env = env_for_tests()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return env


def test_entry_point_plugin_shows_up_and_trains(tmp_path):
    env = _install_plugin(
        tmp_path,
        "my-single = myplugin:MySingle",
        """
        from strategies.single import SingleDeviceStrategy, started_more_than_one

        class MySingle(SingleDeviceStrategy):
            description = "a third-party plugin"
    """,
    )
    listing = run_cli(["list"], env=env, timeout=60)
    assert "my-single" in listing.stdout and "a third-party plugin" in listing.stdout
    out = tmp_path / "run"
    proc = run_cli(
        ["train", "strategy=my-single", "steps=2", "seq_len=16", "batch_size=4", "data_samples=32", f"out_dir={out}"],
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "summary.json").exists()


def test_broken_entry_point_is_listed_unavailable(tmp_path):
    env = _install_plugin(tmp_path, "broken = myplugin:Missing", "x = 1\n")
    listing = run_cli(["list"], env=env, timeout=60)
    assert listing.returncode == 0
    line = next(line for line in listing.stdout.splitlines() if line.strip().startswith("broken"))
    assert "unavailable" in line and "failed to load" in line
