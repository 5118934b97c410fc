"""`runner.py compare plan=<search json> top=N`: the plan's best layouts run with their settings
beside single, and the report shows each layout's planned figures beside its measured ones."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from configs.schema import ConfigError, RunConfig, checkpointing_mode
from harness.common.testing_hooks import AVAILABLE_MEMORY_ENV
from harness.compare import compare_cli as compare
from harness.compare.fit_here import USABLE_SHARE, needed_bytes
from harness.compare.from_plan import layouts_of, plan_settings
from harness.compare.run_names import safe_name
from harness.plan import peak_for_run, plan_cli
from harness.report.planned_layouts import layout_words, ran_otherwise
from tests.helpers import env_for_tests, run_cli

# Strategies whose layouts `train` runs on a CPU: what is tested is how a plan's layouts run, not which wins.
SEARCH = ["search=true", "model=gpt-nano", "gpus=2", "batch_size=8", "seq_len=32", "strategies=[ddp,fsdp]"]
SEARCH += ["format=json"]
TOP = 3


def _measured_layouts(search: dict) -> list[tuple[int, dict]]:
    """(rank, layout) of the plan's TOP, each of which the compare runs (selective checkpointing too)."""
    return list(enumerate(search["layouts"][:TOP], start=1))


def _tight_memory(search: dict) -> int:
    """Available host memory, faked, in which the plan's first layout fits at half its micro-batch and not
    at its own (the planner's estimate, as fit_here.py makes it)."""
    first = search["layouts"][0]
    micro, local, processes = first["micro_batch"], first["micro_batch"] * first["grad_accum"], 2
    cfg = RunConfig(model="gpt-nano", seq_len=32, batch_size=8, strategy=first["strategy"], precision="fp32")
    need = [needed_bytes(peak_for_run(cfg, processes, (m, local // m)), processes, "cpu") for m in (micro // 2, micro)]
    return int(sum(need) / 2 / USABLE_SHARE)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    """(the search result, the out_dir of `compare plan=... top=3` on a machine whose memory takes the first
    layout's micro-batch at half, its printed output)."""
    folder = tmp_path_factory.mktemp("compare_plan")
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert plan_cli.main(SEARCH) == 0
    plan_file = folder / "plan.json"
    plan_file.write_text(printed.getvalue())
    search = json.loads(printed.getvalue())
    out = folder / "out"
    args = ["compare", f"plan={plan_file}", f"top={TOP}", "steps=3", "noise_runs=0", "device=cpu", f"out_dir={out}"]
    env = {**env_for_tests(), AVAILABLE_MEMORY_ENV: str(_tight_memory(search))}
    # Started from a folder of its own: each layout's checks try the compare's out_dir, and write nothing here.
    elsewhere = folder / "cwd"
    elsewhere.mkdir()
    proc = run_cli([*args, "data_samples=256", "timeout_s=60"], timeout=150, env=env, cwd=elsewhere)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert list(elsewhere.iterdir()) == []
    return search, out, proc.stdout


def test_each_layout_runs_with_its_planned_settings(measured: tuple[dict, Path, str]) -> None:
    search, out, _ = measured
    assert len(_measured_layouts(search)) >= 2
    ran = {layout["label"]: layout for layout in json.loads((out / "compare.json").read_text())["from_plan"]["layouts"]}
    for rank, layout in _measured_layouts(search):
        summary = json.loads((out / safe_name(f"{layout['strategy']}#{rank}") / "summary.json").read_text())
        config = summary["config"]
        assert config["strategy"] == layout["strategy"]
        assert config["strategy_options"] == layout["strategy_options"]
        here = ran[f"{layout['strategy']}#{rank}"]
        assert (summary["micro_batch"], summary["grad_accum"]) == (here["micro_batch"], here["grad_accum"])
        assert summary["micro_batch"] * summary["grad_accum"] == layout["micro_batch"] * layout["grad_accum"]
        ran_checkpointing = checkpointing_mode(config["activation_checkpointing"], config["selective_checkpointing"])
        assert ran_checkpointing == layout["activation_checkpointing"]
        assert (config["seq_len"], config["batch_size"]) == (32, 8)
        assert summary["world_size"] == 2


def test_a_micro_batch_that_does_not_fit_here_is_halved_and_said(measured: tuple[dict, Path, str]) -> None:
    """The first layout's planned micro-batch does not fit the (faked) memory: it runs half of it, with
    twice the accumulation, and the compare's output and its report say so."""
    search, out, printed = measured
    first = search["layouts"][0]
    label = f"{first['strategy']}#1"
    summary = json.loads((out / safe_name(label) / "summary.json").read_text())
    assert (summary["micro_batch"], summary["grad_accum"]) == (first["micro_batch"] // 2, 2 * first["grad_accum"])
    words = f"micro-batch {first['micro_batch']} does not fit this machine's memory"
    assert words in printed
    assert words in (out / "report.md").read_text()


def test_layouts_learn_what_single_learns(measured: tuple[dict, Path, str]) -> None:
    search, out, _ = measured
    results = json.loads((out / "results.json").read_text())
    assert results["reference"] == "single"
    ran = {f"{layout['strategy']}#{rank}" for rank, layout in _measured_layouts(search)}
    layouts = [r for r in results["strategies"] if r["name"] in ran]
    assert len(layouts) == len(ran)
    assert all(r["status"] == "ok" and r["matches_reference"] for r in layouts), layouts


def test_report_shows_planned_beside_measured(measured: tuple[dict, Path, str]) -> None:
    search, out, _ = measured
    report = (out / "report.md").read_text()
    heading = "## The plan's layouts, planned against measured"
    assert heading in report
    section = report.split(heading)[1].split("\n## ")[0]
    for rank, layout in _measured_layouts(search):
        row = next(line for line in section.splitlines() if line.startswith(f"| `{layout['strategy']}#{rank}` |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == str(rank)
        assert cells[4] == f"{layout['tokens_per_s_per_gpu']:,.0f}"
        assert cells[5] != "n/a" and cells[7].endswith("states")  # measured speed; on a CPU the model states
        assert "ran with" not in cells[3]  # each run recorded the layout it was sent to run


def _layout(strategy: str, tp: int, micro: int, accum: int, checkpointing: str = "none", pp: int = 1) -> dict:
    return {
        "strategy": strategy,
        "strategy_options": ({"tp_size": tp} if tp > 1 else {}) | ({"pp_size": pp} if pp > 1 else {}),
        "tp": tp,
        "pp": pp,
        "cp": 1,
        "data_parallel": 4 // (tp * pp),
        "micro_batch": micro,
        "grad_accum": accum,
        "activation_checkpointing": checkpointing,
        "tokens_per_s_per_gpu": 1000.0,
        "peak_allocated_bytes": 1,
        "peak_reserved_bytes": 1,
    }


def test_a_layout_planned_on_more_gpus_keeps_its_micro_batch_and_the_global_batch() -> None:
    search = {
        "question": {"gpus": 4},
        "layouts": [
            _layout("ddp", 1, 2, 1),
            _layout("ddp", 1, 1, 2),
            _layout("ddp-tp", 4, 8, 1),
            _layout("ddp", 1, 2, 1, "selective"),
            _layout("fsdp-pp", 1, 4, 1),  # its pp left to the default: the plan's, pinned
            _layout("ddp-tp", 2, 4, 1, pp=2),
            _layout("dataparallel", 1, 2, 1, "selective"),
        ],
    }
    fewer, split, too_wide, selective, pinned, deep, threads = layouts_of(search, 7, nproc=2)
    assert threads.nproc == 1 and threads.refused is None  # one process drives every GPU
    assert (fewer.nproc, fewer.micro_batch, fewer.grad_accum) == (2, 2, 2)
    assert "planned on 4 GPUs" in str(fewer.scaled)
    assert (fewer.label, split.label) == ("ddp#1", "ddp#2") and fewer.folder != split.folder
    assert "tp 4 needs 4 processes" in str(too_wide.refused) and "nproc=4" in str(too_wide.refused)
    assert selective.refused is None
    assert selective.run_settings() | {"activation_checkpointing": True, "selective_checkpointing": True} == (
        selective.run_settings()
    )
    assert pinned.strategy_options == {"tp_size": 1, "pp_size": 1, "cp_size": 1}
    assert "tp 2 x pp 2 needs 4 processes" in str(deep.refused)


def test_an_expert_parallel_layout_wider_than_the_processes_is_refused_before_it_is_scaled() -> None:
    """ep borrows data-parallel ranks, and train refuses an ep_size that does not divide them: a layout
    planned at ep 8 on 16 GPUs is not said to run on 2 processes and then refused by train, but refused
    with the processes it needs; at ep 2 it runs on the 2, its ep kept."""
    wide, narrow = (
        _layout("zero1-ep", 1, 2, 1) | {"strategy_options": {"ep_size": ep}, "ep": ep, "data_parallel": 16}
        for ep in (8, 2)
    )
    too_wide, fewer = layouts_of({"question": {"gpus": 16}, "layouts": [wide, narrow]}, 2, nproc=2)
    assert too_wide.scaled is None and too_wide.refused == (
        "ep 8 needs 8 processes and this compare has 2: give nproc=8 or more"
    )
    assert fewer.refused is None and fewer.nproc == 2 and fewer.strategy_options == {"ep_size": 2}


def test_a_plan_that_cannot_be_measured_is_one_line(tmp_path: Path) -> None:
    not_search = tmp_path / "not_search.json"
    not_search.write_text(json.dumps({"question": {}}))
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"question": {"gpus": 2}, "layouts": [_layout("ddp", 1, 2, 1)]}))
    out = f"out_dir={tmp_path / 'out'}"
    with pytest.raises(ConfigError, match="no such file: give the JSON that `runner.py plan search=true"):
        compare.main([f"plan={tmp_path / 'missing.json'}", out])
    with pytest.raises(ConfigError, match="is not a search result"):
        compare.main([f"plan={not_search}", out])
    with pytest.raises(ConfigError, match="holds 1 layout that fit: give top=1 or fewer"):
        compare.main([f"plan={short}", "top=2", out])
    # The search kept its top 1 of the 39 that fit: not "search a cluster where more fit", but keep more.
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"question": {"gpus": 2}, "fit": 39, "top": 1, "layouts": [_layout("ddp", 1, 2, 1)]}))
    with pytest.raises(
        ConfigError,
        match=r"keeps the search's top 1 layout of the 39 that fit: give top=1 or fewer, or "
        r"search again keeping 5 \(`runner.py plan search=true .* top=5 format=json > plan.json`\)",
    ):
        compare.main([f"plan={kept}", "top=5", out])
    with pytest.raises(ConfigError, match="plan= sets model, micro_batch from the plan"):
        compare.main([f"plan={short}", "model=gpt2-124m", "micro_batch=2", out])
    with pytest.raises(ConfigError, match="top=0 must be 1 or more"):
        compare.main([f"plan={short}", "top=0", out])
    with pytest.raises(ConfigError, match="top= picks the best layouts of a plan"):
        compare.main(["top=2", out])


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda s: s["layouts"].__setitem__(0, "abc"), "layout 1 is not an object"),
        (lambda s: s["layouts"][0].pop("strategy"), "layout 1 names no strategy"),
        (lambda s: s["layouts"][1].__setitem__("grad_accum", "x"), "layout 2 has grad_accum='x'"),
        (lambda s: s["layouts"][0].__setitem__("micro_batch", 2.5), "layout 1 has micro_batch=2.5"),
        (lambda s: s["layouts"][0].__setitem__("strategy_options", [1]), "strategy_options that are not an object"),
        (lambda s: s["question"].__setitem__("gpus", 0), "its question's gpus is 0"),
        (lambda s: s["question"].pop("model"), "its question names no model"),
        (lambda s: s.__setitem__("question", []), "its question is not an object"),
    ],
)
def test_a_hand_edited_plan_is_one_line_naming_what_is_wrong(tmp_path: Path, edit, says) -> None:
    # Each used to be a KeyError, TypeError or ZeroDivisionError from deep in the compare.
    search = {
        "question": {"model": "gpt-nano", "gpus": 4, "seq_len": 32, "global_batch_sequences": 8},
        "layouts": [_layout("ddp", 1, 2, 1), _layout("fsdp", 1, 2, 1)],
    }
    edit(search)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(search))
    with pytest.raises(ConfigError, match="is not a search result") as err:
        compare.main([f"plan={plan}", "top=2", f"out_dir={tmp_path / 'out'}"])
    assert says in str(err.value)


def test_a_plan_in_which_nothing_fits_says_so(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"question": {"model": "gpt-nano", "gpus": 4}, "layouts": []}))
    with pytest.raises(ConfigError, match="holds no layout that fits: search a larger cluster or a smaller model"):
        compare.main([f"plan={plan}", "top=1", f"out_dir={tmp_path / 'out'}"])


def test_an_empty_plan_is_one_line_not_a_whole_default_compare(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plan= is empty: give a value, or leave plan= out"):
        compare.main(["plan=", f"out_dir={tmp_path / 'out'}"])


def test_the_plans_model_kwargs_size_every_run(tmp_path: Path) -> None:
    """A plan of `hf:LlamaConfig model_kwargs.hidden_size=64 ...` is a plan of that small model: its runs
    build it, not the config class's default (a 7B Llama, out of memory), and a model_kwargs given beside
    plan= is refused as model= is."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert plan_cli.main([*SEARCH, "model_kwargs.n_layer=3"]) == 0
    search = json.loads(printed.getvalue())
    settings = plan_settings(search)
    assert settings == {"model": "gpt-nano", "model_kwargs": {"n_layer": 3}, "seq_len": 32, "batch_size": 8}
    plan = tmp_path / "plan.json"
    plan.write_text(printed.getvalue())
    with pytest.raises(ConfigError, match="plan= sets model_kwargs from the plan"):
        compare.main([f"plan={plan}", "model_kwargs.n_layer=4", f"out_dir={tmp_path / 'out'}"])


def test_a_plan_of_a_model_described_by_its_sizes_says_train_cannot_build_it(tmp_path: Path) -> None:
    """`plan search=true layers=2 width=64 ...` is a search result, not a hand-edited file: it was refused as
    "not a search result"; the line now says why it cannot be measured and what to search instead."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        described = ["layers=2", "width=64", "heads=2", "vocab=128", "ffn=256"]
        assert plan_cli.main([a for a in SEARCH if not a.startswith("model=")] + described) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(printed.getvalue())
    with pytest.raises(ConfigError, match="plans a model described by its sizes .* which train cannot build"):
        compare.main([f"plan={plan}", "top=1", f"out_dir={tmp_path / 'out'}"])


def test_a_run_that_recorded_another_layout_than_it_was_sent_is_said_in_the_report() -> None:
    """The plan's table said what each layout was sent to run; what the run recorded (its summary's mesh,
    micro-batch, accumulation, checkpointing) was never held to it, so a layout silently laid out otherwise
    read as measured as planned."""
    layout = {
        "label": "ddp-tp#1",
        "nproc": 4,
        "micro_batch": 8,
        "grad_accum": 1,
        "checkpointing": "full",
        "strategy_options": {"tp_size": 2, "pp_size": 2, "schedule": "interleaved-1f1b", "microbatches": 2},
        "planned": {"tp": 2, "pp": 2, "cp": 1, "ep": 1},
    }
    as_sent = {
        "mesh": {"dims": ["pp", "replicate", "tp"], "shape": [2, 1, 2]},
        "data_parallel_size": 1,
        "micro_batch": 8,
        "grad_accum": 1,
        "config": {"activation_checkpointing": True},
    }
    assert layout_words(layout) == "4 proc, tp 2 x pp 2 (interleaved-1f1b, 2 micro-batches), 8 x 1, ckpt full"
    assert ran_otherwise(layout, as_sent) is None
    otherwise = {**as_sent, "mesh": {"dims": ["replicate", "tp"], "shape": [2, 2]}, "data_parallel_size": 2}
    assert ran_otherwise(layout, otherwise) == "ran with pp 1 (sent 2), data-parallel ranks 2 (sent 1)"
    hybrid = {**layout, "strategy_options": {"shard_size": 2}, "planned": {"tp": 1}, "checkpointing": "none"}
    flat = {**as_sent, "mesh": {"dims": ["replicate", "shard"], "shape": [1, 4]}, "data_parallel_size": 4}
    assert ran_otherwise(hybrid, {**flat, "config": {"activation_checkpointing": False}}) == "ran with shard 4 (sent 2)"
    selective = {**layout, "checkpointing": "selective"}
    assert ran_otherwise(selective, as_sent) == "ran with checkpointing full (sent selective)"
    ran_selective = {**as_sent, "config": {"activation_checkpointing": True, "selective_checkpointing": True}}
    assert ran_otherwise(selective, ran_selective) is None


def test_a_hybrid_or_hpz_group_wider_than_the_processes_is_refused_before_it_is_scaled() -> None:
    """hsdp planned at shard 4 on 8 GPUs was said to run on 2 processes, then refused by train with
    `shard_size=4 does not divide the world size 2: use one of 1, 2`, a fix the plan's layout cannot take.
    Like ep, a shard or hpZ group is kept whole: the processes it needs, or a run that keeps it."""
    hybrid, partitioned = (
        _layout(name, 1, 2, 1) | {"strategy_options": {key: 4}, "data_parallel": 8}
        for name, key in (("hsdp", "shard_size"), ("zero3-hpz", "zero_hpz_partition_size"))
    )
    for layout, group in ((hybrid, "shard 4"), (partitioned, "hpz 4")):
        too_wide, kept = (layouts_of({"question": {"gpus": 8}, "layouts": [layout]}, 1, nproc=n)[0] for n in (2, 4))
        assert too_wide.scaled is None and too_wide.refused == (
            f"{group} needs 4 processes and this compare has 2: give nproc=4 or more"
        )
        assert kept.refused is None and kept.nproc == 4 and kept.grad_accum == 2
    # The replicas are what fewer processes drop, and the scaled layout says so.
    kept_hybrid = layouts_of({"question": {"gpus": 8}, "layouts": [hybrid]}, 1, nproc=4)[0]
    assert "data parallel 8: shard 4 x 2 replicas" in str(kept_hybrid.scaled)
    assert "(tp 1 x 4: shard 4 x 1 replica)" in str(kept_hybrid.scaled)
