"""The compare report (report.md and a self-contained report.html), built from
results.json and the run folders, so `runner.py report <dir>` can rebuild it at
any time; `compare` calls the same `build_report` when its sweep ends. Where results.json
is missing or older than the run folders (the compare was killed before it wrote them), it
is made again from the folders first (harness/compare/collect.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from configs.schema import checkpointing_mode
from harness.common.colours import strategy_colours
from harness.common.units import human_bytes
from harness.common.writable import FolderError, check_writable
from harness.compare import (
    RESULTS_FILE,
    NoiseBand,
    StrategyResult,
    bound_at,
    floor_of,
    load_metrics,
    results_for_report,
    run_summary,
)
from harness.report import figures
from harness.report.advice import advice_from_results
from harness.report.document import (
    Bullets,
    Element,
    Figure,
    Heading,
    Paragraph,
    Preformatted,
    Table,
    to_html,
    to_markdown,
)
from harness.report.planned_layouts import planned_layouts
from strategies.base import compute_precision

FIGURE_DIR = "figures"
PREDICTED = (
    ("mem_params_bytes", "params / rank", "bytes"),
    ("mem_grads_bytes", "grads / rank", "bytes"),
    ("mem_optimizer_bytes", "optimizer / rank", "bytes"),
    ("peak_mem_allocated_bytes", "peak allocated / rank", "bytes"),
    ("tokens_per_s", "tokens/s", "rate"),
)


def main(args: list[str]) -> int:
    if len(args) != 1 or "=" in args[0]:
        raise ValueError("usage: runner.py report <dir>: the out_dir of a `runner.py compare` run")
    folder = Path(args[0])
    if folder.name == RESULTS_FILE and folder.is_file():  # the compare's results file: its folder is meant
        folder = folder.parent
    if not folder.exists():
        raise FolderError(f"{folder} does not exist: give the out_dir of a `runner.py compare` run")
    if folder.is_dir():  # a file is read_results' error: it holds no results
        check_writable(folder, f"the compare folder {folder}", create=False, fix="copy it somewhere writable first")
    try:
        md_path, html_path = build_report(folder)
    except ValueError:  # parabench's own one-line errors (no results, a damaged file it reads)
        raise
    except OSError as exc:  # report.md a folder, figures a file
        raise FolderError(
            f"the report cannot be written in {folder} ({exc.strerror or exc}: {exc.filename}): remove what stands "
            "where report.md, report.html and figures/ go, or copy the folder elsewhere"
        ) from None
    except (AttributeError, KeyError, TypeError, IndexError) as exc:  # a hand-edited results.json
        raise FolderError(
            f"{folder}/results.json is not a parabench compare's results ({type(exc).__name__}: {exc}): give the "
            "out_dir of a `runner.py compare` run as it wrote it"
        ) from None
    print(f"report: {md_path}\n        {html_path}")
    return 0


def build_report(compare_dir: Path) -> tuple[Path, Path]:
    """Write report.md, report.html and figures/*.png into `compare_dir`; returns the two reports."""
    sweep, results = results_for_report(compare_dir)
    curves = {r.name: load_metrics(compare_dir / str(r.run_dir)) for r in results if r.ran}
    curves = {name: rows for name, rows in curves.items() if rows}
    title = _title(sweep)
    elements = _elements(compare_dir, sweep, results, curves)
    md_path, html_path = compare_dir / "report.md", compare_dir / "report.html"
    md_path.write_text(to_markdown(title, elements, compare_dir))
    html_path.write_text(to_html(title, elements))
    return md_path, html_path


def _title(sweep: dict[str, Any]) -> str:
    model = sweep.get("model", {})
    params = f" ({model['num_params'] / 1e6:.2f}M params)" if model.get("num_params") else ""
    env = sweep.get("environment", {})
    return (
        f"parabench compare: {model.get('name', '?')}{params}, {sweep.get('precision')}, "
        f"{sweep.get('nproc')} x {env.get('device', sweep.get('device_type'))}"
    )


def loss_bound(compare_dir: Path, sweep: dict[str, Any], curves) -> figures.LossBound | None:
    """The bound the verdicts used, step by step, for the figure (for a backend returning an fp32 loss)."""
    reference_rows = curves.get(sweep.get("reference"))
    if not reference_rows:
        return None
    steps = [r["step"] for r in reference_rows]
    band = noise_band_of(sweep)
    if band is None:
        tolerance = float(sweep.get("tolerance", 1e-4))
        return figures.LossBound(steps, [tolerance] * len(steps), f"fixed tolerance {tolerance:.0e}")
    floor = floor_of(band, sweep.get("precision", "fp32"))
    noise_curves = [
        load_metrics(compare_dir / run["run_dir"]) for run in sweep["noise"]["runs"] if run["status"] == "ok"
    ]
    return figures.LossBound(
        steps,
        [bound_at(band, step, floor)[0] for step in steps],
        f"allowed: {band.factor:g}x the noise runs' spread, or {floor[1]} ({floor[0]:.0e})",
        spread=band.spread,
        noise_curves=noise_curves,
    )


def noise_band_of(sweep: dict[str, Any]) -> NoiseBand | None:
    recorded = (sweep.get("noise") or {}).get("band")
    return NoiseBand(**{k: v for k, v in recorded.items() if k != "rule"}) if recorded else None


def _elements(compare_dir: Path, sweep: dict[str, Any], results: list[StrategyResult], curves) -> list[Element]:
    device_type = sweep.get("device_type", "cpu")
    reference = sweep.get("reference")
    bound = loss_bound(compare_dir, sweep, curves)
    figure_dir = compare_dir / FIGURE_DIR
    for stale in figure_dir.glob("*.png"):
        stale.unlink()  # a figure with nothing to draw this time must not survive from an earlier run
    colour = strategy_colours([r.name for r in results])
    ran = [r for r in results if r.ran]

    elements: list[Element] = [*_overview(sweep, results)]
    elements += [Heading("Summary (fastest first)"), _summary_table(ran, device_type)]
    elements += _meshes(compare_dir, ran)
    elements += _routing(compare_dir, ran)
    elements += _config_files(results)
    elements += _compare_wide_options(sweep, results)
    elements += _verdict_rule(sweep) + _unstable_start(curves.get(reference, []), sweep)
    if device_type == "cpu":
        elements.append(
            Paragraph(
                "Peak memory is not measured on CPU (no allocator statistics): the memory columns "
                "and figures show the model states each rank holds, measured from the tensors."
            )
        )
    drawn = [
        (
            "Loss curves",
            figures.loss_curves(curves, colour, sweep.get("loss_floor"), reference, figure_dir / "loss.png"),
            "Training loss of every strategy that finished; the dashed line is the data set's lowest reachable loss.",
        ),
        (
            "Loss minus the reference",
            bound and figures.loss_vs_reference(curves, colour, reference, bound, figure_dir / "loss_vs_reference.png"),
            f"Each strategy's loss minus `{reference}`'s (grey: the noise runs), and its relative size against what a "
            f"correct backend may differ by (shaded: {bound.label if bound else ''}).",
        ),
        (
            "Memory per rank",
            figures.memory_per_rank(results, device_type, figure_dir / "memory.png"),
            "Parameters, gradients and optimizer state each rank holds"
            + (
                ", and the rest of the peak allocated memory."
                if device_type == "cuda"
                else " (CPU: model states only)."
            ),
        ),
        (
            "Throughput",
            figures.throughput(results, colour, figure_dir / "throughput.png"),
            "Tokens per second over the whole job after the warm-up steps.",
        ),
        (
            "Memory against throughput",
            figures.memory_vs_throughput(results, colour, device_type, figure_dir / "memory_vs_throughput.png"),
            "Each finished strategy's memory per rank against its throughput.",
        ),
    ]
    for heading, path, caption in drawn:
        if path is not None:
            elements += [Heading(heading), Figure(path, caption)]
    elements += _predictions(ran)
    elements += planned_layouts(sweep, results, compare_dir)
    elements += _calibration(compare_dir, sweep)
    elements += _batch_search(sweep.get("batch_search"))
    elements += _problems(results)
    elements += _environment(sweep)
    elements += [Heading("Recommendation"), Bullets(advice_from_results(results, device_type))]
    return elements


def _overview(sweep: dict[str, Any], results: list[StrategyResult]) -> list[Element]:
    config = sweep.get("config", {})
    reference = sweep.get("reference")
    ran = [r for r in results if r.ran]
    agreeing = [r for r in ran if r.matches_reference and r.name != reference]
    within = sum(r.verdict_kind == "within noise" for r in agreeing)
    counts = {s: sum(r.status == s for r in results) for s in ("failed", "skipped", "interrupted", "not run")}
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    ref_text = (
        f"`{reference}`" + (" (one process)" if reference == "single" else " (`single` did not run)")
        if reference
        else "none (no strategy finished)"
    )
    elements: list[Element] = [Paragraph(line) for line in _state_lines(sweep, results)]
    elements.append(
        Paragraph(
            f"Every strategy trained the same model on the same data from the same seed, with global batch "
            f"{config.get('batch_size')} x {config.get('seq_len')} tokens for {config.get('steps')} steps"
            f"{_checkpointing_words(config)}, on "
            f"{sweep.get('nproc')} {sweep.get('device_type')} processes (`single`: one). "
            f"{len(ran)} of {len(results)} strategies finished; {len(agreeing)} of the others learn what the reference "
            f"learns ({len(agreeing) - within} match it, {within} within noise)"
            + (f"; {tally}" if tally else "")
            + f". Reference: {ref_text}."
        )
    )
    elements.append(
        Paragraph(
            f"Command: `{sweep.get('command', 'python runner.py compare')}` "
            f"(started {sweep.get('started_at', '?')}, {sweep.get('wall_time_s', 0):.0f} s)."
        )
    )
    return elements


# What a compare-wide activation_checkpointing recomputes, as the overview says it (none: nothing said).
RECOMPUTED = {
    "full": " under activation checkpointing (full: each block recomputed in the backward from its input)",
    "selective": " under activation checkpointing (selective: torchtitan's op-level policy in each block, every "
    "second matmul's output and the attention's kept, the rest recomputed)",
}


def _checkpointing_words(config: dict[str, Any]) -> str:
    mode = checkpointing_mode(config.get("activation_checkpointing"), config.get("selective_checkpointing"))
    return RECOMPUTED.get(mode, "")


STATE_LINES = {
    "running": "**Still running:** this report covers the runs that finished so far (the compare rewrites "
    "results.json after every run).",
    "interrupted": "**Interrupted (Ctrl-C, SIGTERM or SIGHUP): this report covers only the strategies that "
    "finished.** The same command with `resume=auto` continues the sweep.",
    "stopped": "**Stopped before its end (the compare was killed): this report covers only the strategies that "
    "finished.** The same command with `resume=auto` continues the sweep.",
}


def _state_lines(sweep: dict[str, Any], results: list[StrategyResult]) -> list[str]:
    """Whether the sweep is whole, and which results an earlier compare left (resume=auto)."""
    state = sweep.get("state") or ("interrupted" if sweep.get("interrupted") else "finished")
    lines = [STATE_LINES[state]] if state in STATE_LINES else []
    if sweep.get("rebuilt"):
        lines.append(f"Results {sweep['rebuilt']}.")
    kept = [f"`{r.name}`" for r in results if r.kept]
    noise_kept = sum(bool(run.get("kept")) for run in (sweep.get("noise") or {}).get("runs", []))
    if noise_kept:
        kept.append(f"{noise_kept} noise run{'s' if noise_kept != 1 else ''}")
    if kept:
        lines.append(
            f"Kept from an earlier compare into this folder (`resume=auto`: the same configuration, finished), "
            f"not run again: {', '.join(kept)}."
        )
    continued = [f"`{r.name}` from step {r.resumed_from_step}" for r in results if r.ran and r.resumed_from_step]
    if continued:
        lines.append(
            f"Continued from its own last checkpoint after a stop: {', '.join(continued)} (its tokens/s and step time "
            "are of the steps after it)."
        )
    return lines


def _verdict_rule(sweep: dict[str, Any]) -> list[Element]:
    """How the loss verdicts were reached: against measured noise, or a fixed tolerance, and why."""
    noise = sweep.get("noise") or {}
    band = noise_band_of(sweep)
    precision = sweep.get("precision", "fp32")
    fp8 = (
        [
            Paragraph(
                "precision=fp8: the reference ran in bf16, and so did its noise runs. Each fp8 verdict says whether "
                "float8 training learns what bf16 training learns, judged against bf16's own noise; a difference "
                "past it is float8's rounding at work, not a backend's fault."
            )
        ]
        if precision == "fp8"
        else []
    )
    if band is None:
        why = noise.get("skipped") or "this compare ran no noise runs"
        return fp8 + [
            Paragraph(
                f"Loss verdicts: within {float(sweep.get('tolerance', 0)):.0e} relative of the reference "
                f"at every step ({precision}), a fixed tolerance ({why})."
            )
        ]
    ok = [run for run in noise.get("runs", []) if run["status"] == "ok"]
    seconds = sum(run["wall_time_s"] for run in noise.get("runs", []))
    peak = max(range(len(band.band)), key=band.band.__getitem__)
    floor, what = floor_of(band, precision)
    rounded = compute_precision(precision)
    return fp8 + [
        Paragraph(
            f"Loss verdicts are judged against noise measured here: `{noise.get('reference')}` ran again {len(ok)} "
            f"time{'s' if len(ok) != 1 else ''} with every gradient nudged by up to one rounding step of {rounded} "
            f"(of its tensor's typical size; {seconds:.0f} s in all), and strayed from itself by up to "
            f"{max(band.spread):.1e} (relative; band "
            f"{band.band[peak]:.1e} at step {band.steps[peak]}). A strategy matches within {band.floor:.0e}, is within "
            f"noise within {band.factor:g}x the band or {what} ({floor:.0e}), whichever is larger, and differs "
            f"past that: the verdict names the step. `noise_runs=0` judges by a fixed tolerance instead."
        )
    ]


# The reference's loss rising this far above where it started marks an unstable start: differences
# between strategies there are chaos the learning rate amplified, not the backends.
UNSTABLE_RISE = 0.03


def _unstable_start(reference_rows: list[dict], sweep: dict[str, Any]) -> list[Element]:
    if not reference_rows:
        return []
    first = reference_rows[0]
    peak = max(reference_rows, key=lambda r: r["loss"])
    if peak["loss"] <= first["loss"] * (1 + UNSTABLE_RISE):
        return []
    config = sweep.get("config", {})
    return [
        Paragraph(
            f"**Unstable start:** the reference's loss rose from {first['loss']:.4f} at step {first['step']} to "
            f"{peak['loss']:.4f} at step {peak['step']}. Rounding differences grow fastest there, so verdicts near it "
            f"say more about the learning rate (lr={config.get('lr') or 'by model size'}, warmup_steps="
            f"{config.get('warmup_steps') or 'a tenth of the run'}) than about the backends: lower lr= or lengthen "
            "the warm-up and compare again."
        )
    ]


def _summary_table(ran: list[StrategyResult], device_type: str) -> Table:
    def peak(value: int | None) -> str:
        return human_bytes(value) if device_type == "cuda" else "n/a (CPU)"

    rows = []
    for r in sorted(ran, key=lambda r: -(r.tokens_per_s or 0)):
        rows.append(
            [
                f"`{r.name}`",
                str(r.nproc),
                _number(r.tokens_per_s, "{:,.0f}"),
                _number(r.step_time_s, "{:.1f}", 1e3),
                _number(r.mfu, "{:.1%}"),
                peak(r.peak_mem_allocated_bytes),
                peak(r.peak_mem_reserved_bytes),
                human_bytes(r.mem_params_bytes),
                human_bytes(r.mem_grads_bytes),
                human_bytes(r.mem_optimizer_bytes),
                _number(r.final_loss, "{:.4f}"),
                r.verdict,
            ]
        )
    headers = [
        "strategy",
        "ranks",
        "tokens/s",
        "step ms",
        "MFU",
        "peak alloc / rank",
        "peak reserved / rank",
        "params / rank",
        "grads / rank",
        "optimizer / rank",
        "final loss",
        "vs reference",
    ]
    return Table(headers, rows, right_aligned=set(range(1, 11)))


def _meshes(compare_dir: Path, ran: list[StrategyResult]) -> list[Element]:
    """How each finished run laid out its ranks (its summary.json's mesh), when any declared one:
    the data-parallel degree is what split the global batch."""
    rows, any_declared = [], False
    for r in ran:
        summary = run_summary(compare_dir, r)
        mesh = summary.get("mesh")
        if not mesh:
            continue
        declared = mesh["dims"] != ["data"]
        any_declared = any_declared or declared
        rows.append(
            [
                f"`{r.name}`",
                " x ".join(map(str, mesh["shape"])) + (": " + " x ".join(mesh["dims"]) if declared else ""),
                " x ".join(mesh["data_dims"]) if declared else "every rank",
                str(summary.get("data_parallel_size", r.nproc)),
                "; ".join(mesh.get("notes", [])),
            ]
        )
    if not any_declared:
        return []
    return [
        Heading("Meshes"),
        Paragraph(
            "How each strategy laid out its ranks. The global batch is split over the data-parallel ranks "
            "(the product of the data dimensions); the ranks of a tensor-parallel group read the same micro-batch, "
            "and the loss is the mean over the global batch either way."
        ),
        Table(["strategy", "mesh", "data split over", "data-parallel ranks", "note"], rows, right_aligned={3}),
    ]


def _routing(compare_dir: Path, ran: list[StrategyResult]) -> list[Element]:
    """What the routers of a mixture-of-experts model did under each strategy (its summary.json's
    router), beside the memory and throughput it cost: nothing for a model without experts."""
    rows = []
    for r in sorted(ran, key=lambda r: -(r.tokens_per_s or 0)):
        router = run_summary(compare_dir, r).get("router")
        if not router:
            continue
        counts = router["router_tokens_per_expert"]
        a2a = router.get("all_to_all_ms_per_step")
        rows.append(
            [
                f"`{r.name}`",
                _number(r.tokens_per_s, "{:,.0f}"),
                human_bytes(r.mem_params_bytes),
                f"{len(counts)} x {len(counts[0])}",
                " / ".join(f"{x:.2f}" for x in router["router_imbalance"]),
                f"{router['router_dropped_fraction']:.1%}",
                "none" if router.get("capacity_factor") is None else str(router["capacity_factor"]),
                "n/a" if a2a is None else f"{a2a:.1f}",
            ]
        )
    if not rows:
        return []
    return [
        Heading("Routing"),
        Paragraph(
            "What each MoE layer's router did over the whole run, summed over the ranks: the busiest expert's load "
            "over the mean load, per layer (1.00: perfectly balanced), the share of the routed tokens dropped over "
            "capacity, and, where experts are sharded over ranks, the all-to-all time per step (the dispatch and "
            "combine, timed on the last step of each logging interval; DeepSpeed's MoE times its forward ones only)."
        ),
        Table(
            [
                "strategy",
                "tokens/s",
                "params / rank",
                "MoE layers x experts",
                "load max/mean per layer",
                "dropped",
                "capacity factor",
                "all-to-all ms / step",
            ],
            rows,
            right_aligned={1, 2, 5, 7},
        ),
    ]


def _config_files(results: list[StrategyResult]) -> list[Element]:
    """The config files given as strategies: which file each label is, the built-in it ran as (and
    was planned as), and what parabench followed of it."""
    files = [r for r in results if r.strategy is not None]
    if not files:
        return []
    rows = [[f"`{r.name}`", f"`{r.strategy}`", r.description, "; ".join(r.followed) or "-"] for r in files]
    return [
        Heading("Config files"),
        Paragraph(
            "Each file ran through its backend as its users run it (an Accelerate config as `accelerate launch "
            "--config_file` sets Accelerate up, a DeepSpeed JSON through `deepspeed.initialize`), on the same model, "
            "data, seed and global batch as the rest, by the class of the built-in it amounts to, which the planner "
            "planned it as. What parabench followed of each file instead of refusing it:"
        ),
        Table(["strategy", "file", "what it is", "followed"], rows),
    ]


def _compare_wide_options(sweep: dict[str, Any], results: list[StrategyResult]) -> list[Element]:
    """The `strategy_options.<key>=` and `deepspeed_config=` given for the whole compare, and which
    strategies took each."""
    options = sweep.get("compare_wide_options") or {}
    deepspeed = sweep.get("deepspeed_config")
    if deepspeed:
        options = {**options, "deepspeed_config": deepspeed}
    if not options:
        return []
    names = [r.name for r in results]
    rows = []
    for key, taken in options.items():
        others = [name for name in names if name not in taken["taken_by"]]
        rows.append(
            [
                f"`{key}={json.dumps(taken['value'])}`",
                ", ".join(f"`{name}`" for name in taken["taken_by"]),
                ", ".join(f"`{name}`" for name in others) or "-",
            ]
        )
    return [
        Heading("Compare-wide options"),
        Paragraph(
            "Each `strategy_options.<key>=` given for the whole compare reached the strategies that have that option, "
            "and `deepspeed_config=` those that run DeepSpeed; the others ran without it."
        ),
        Table(["option", "taken by", "not an option of"], rows),
    ]


def _number(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else fmt.format(value * scale)


def _predictions(ran: list[StrategyResult]) -> list[Element]:
    """One row per strategy, one column per predicted quantity: `predicted / measured (error)`."""
    predicted_keys = [key for key, _, _ in PREDICTED if any((r.prediction or {}).get(key) is not None for r in ran)]
    if not predicted_keys:
        return []
    columns = [(key, label, kind) for key, label, kind in PREDICTED if key in predicted_keys]
    rows = []
    for r in ran:
        prediction = r.prediction or {}
        if not any(prediction.get(key) is not None for key in predicted_keys):
            continue
        rows.append(
            [f"`{r.name}`"] + [_predicted_cell(prediction.get(key), getattr(r, key), kind) for key, _, kind in columns]
        )
    return [
        Heading("Predicted against measured"),
        Paragraph(
            "The planner's prediction for each run beside what the run measured: "
            "`predicted / measured (error)`, where error = (predicted - measured) / measured."
        ),
        Table(["strategy"] + [label for _, label, _ in columns], rows, right_aligned=set(range(1, len(columns) + 1))),
    ]


def _calibration(compare_dir: Path, sweep: dict[str, Any]) -> list[Element]:
    """What this machine measured against what the planner assumes, fitted as `plan calibrate=` fits it
    (the compare records the fit in results.json)."""
    calibration = sweep.get("calibration") or {}
    if "rows" not in calibration:
        error = calibration.get("error", "the compare recorded no calibration")
        return (
            [Heading("Calibration"), Paragraph(f"Not calibrated: {error}")]
            if sweep.get("device_type") == "cuda"
            else []
        )
    table = [
        [
            f"`{r['strategy']}`",
            f"{r['measured_s'] * 1e3:.1f}",
            f"{r['compute_s'] * 1e3:.1f}",
            f"{r['exposed_comm_s'] * 1e3:.1f}",
            r["fitted"],
            human_bytes(r["memory_missed_bytes"]),
        ]
        for r in calibration["rows"]
    ]
    config = sweep.get("config", {})
    return [
        Heading("Calibration"),
        Paragraph(
            f"The planner's speed model fitted to this machine (`harness/plan/speed/calibration.py`): compute "
            f"scale {calibration['compute_scale']:.2f} against the compute model, then what each strategy "
            f"measured beyond it, as time per micro-step. `python runner.py plan "
            f"calibrate={compare_dir} model={config.get('model')} gpus=...` predicts other sizes and GPU "
            "counts from these figures."
        ),
        Table(
            ["strategy", "measured step ms", "model compute ms", "exposed comm ms", "fitted", "peak the model missed"],
            table,
            right_aligned={1, 2, 3, 5},
        ),
    ]


def _predicted_cell(predicted: float | None, measured: float | None, kind: str) -> str:
    if predicted is None:
        return "n/a"
    show = human_bytes if kind == "bytes" else (lambda v: f"{v:,.0f}")
    if measured is None:
        return f"{show(predicted)} / n/a"
    error = f" ({(predicted - measured) / measured:+.1%})" if measured else ""
    return f"{show(predicted)} / {show(measured)}{error}"


def _batch_search(found: dict | None) -> list[Element]:
    if not found:
        return []
    elements: list[Element] = [Heading("Largest micro-batch per strategy")]
    if "skipped" in found:
        return elements + [Paragraph(found["skipped"])]
    rows = []
    for s in found.get("results", []):
        size = "none fits" if s["largest_micro_batch"] is None else str(s["largest_micro_batch"])
        if s["hit_limit"]:
            size += " (search limit)"
        failed = s["next_size_failed"]
        rows.append(
            [
                f"`{s['strategy']}`",
                "n/a" if s["predicted"] is None else str(s["predicted"]),
                size,
                "n/a" if failed is None else f"{failed} ✗",
                _probes_by_process(s["probes"]),
                _number(s["tokens_per_s"], "{:,.0f}"),
                human_bytes(s["peak_allocated_bytes"]),
                _number(s["wall_time_s"], "{:.0f} s"),
                "; ".join(filter(None, [s["error"], s["note"], s["prediction_note"]])),
            ]
        )
    elements.append(
        Paragraph(
            "Each search starts at the micro-batch the planner predicts is the largest that fits (its predicted peak "
            f"allocated within {found['predicted_within']:.0%} of the device's memory; the compare's micro-batch "
            "where it predicts none), tries the next size up, then grows by 2, 4, ... (or shrinks by 1, 2, 4, ...) "
            "until the answer flips, and bisects: the size found fitted (✓) and the next size up ran out of memory "
            "(✗). Each [...] is one process: a backend "
            "that recovers from an out-of-memory error tries size after size in one process at world size 1, freeing "
            "everything in between; otherwise each probe has a process of its own. Throughput and peak are at the size "
            f"found. The whole search took {found['wall_time_s']:.0f} s"
            + (
                f", until Ctrl-C (or SIGTERM) stopped it during `{found['interrupted']}`'s."
                if found["interrupted"]
                else "."
            )
        )
    )
    headers = ["strategy", "predicted", "found", "next size up", "probes", "tokens/s", "peak alloc", "time", "note"]
    return elements + [Table(headers, rows, right_aligned={1, 2, 3, 5, 6, 7})]


def _probes_by_process(probes: list[dict]) -> str:
    """'[24 ✓, 25 ✗] [26 error]': the probes in order, one bracket per process."""
    marks = {"fits": "✓", "oom": "✗", "error": "error"}
    groups: list[list[str]] = []
    for p in probes:
        if p["new_process"] or not groups:
            groups.append([])
        groups[-1].append(f"{p['micro_batch']} {marks[p['result']]}")
    return " ".join(f"[{', '.join(group)}]" for group in groups)


def _problems(results: list[StrategyResult]) -> list[Element]:
    troubled = [r for r in results if not r.ran]
    if not troubled:
        return []
    rows = [[f"`{r.name}`", r.status, r.error_kind or "", r.error or ""] for r in troubled]
    elements: list[Element] = [
        Heading("Failed and skipped strategies"),
        Table(["strategy", "status", "kind", "reason"], rows),
    ]
    for r in troubled:
        if r.log_tail:
            elements.append(Preformatted(f"{r.name}: last lines of {r.run_dir}/log.txt", "\n".join(r.log_tail)))
    return elements


def _environment(sweep: dict[str, Any]) -> list[Element]:
    env = sweep.get("environment", {})
    versions = env.get("versions", {})
    rows = [
        ["device", str(env.get("device"))],
        ["devices used (world size)", str(env.get("world_size"))],
        ["host", str(env.get("host"))],
    ]
    rows += [
        [name, str(versions.get(name) or "not installed")] for name in ("torch", "deepspeed", "accelerate", "python")
    ]
    return [Heading("Environment"), Table(["", "value"], rows)]
