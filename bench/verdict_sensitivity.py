#!/usr/bin/env python3
"""The smallest error the compare's loss verdict catches: learning-rate errors of 0.01% to 10%
(bench/wrong_plugins.py, registered through the entry-point group as a third-party plugin
would be) and the other wrong plugins, each judged against the reference in one compare.

    python bench/verdict_sensitivity.py                                  # CPU: gpt-nano, fp32 then bf16
    python bench/verdict_sensitivity.py --precisions bf16 --built-ins -- model=gpt2-124m \\
        batch_size=16 seq_len=1024 steps=50 timeout_s=150                # a GPU, with every built-in strategy

Everything after `--` goes to `runner.py compare` as it is. Writes a Markdown table per
precision (each wrong plugin: its largest relative difference, the bound at that step and the
verdict; with --built-ins every built-in strategy's verdict too) to --out with the command,
device and versions, and the compare folders under --work-dir.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.wrong_plugins import LR_ERRORS, PLUGINS, entry_points, lr_error_name  # noqa: E402
from strategies.registry import builtin_registry  # noqa: E402

WRONG = [lr_error_name(e) for e in LR_ERRORS] + [name for name in PLUGINS if name != "lr-off"]


def built_in_names() -> list[str]:
    return builtin_registry().available_names()


def run_compare(precision: str, strategies: list[str], passthrough: list[str], work: Path, site: Path) -> dict:
    out = work / precision
    cmd = [
        sys.executable,
        str(ROOT / "runner.py"),
        "compare",
        f"strategies=[{','.join(strategies)}]",
        f"precision={precision}",
        f"out_dir={out}",
        *passthrough,
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]))
    print(f"$ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return json.loads((out / "results.json").read_text())


def table(doc: dict) -> list[str]:
    rows = ["| strategy | what is wrong | largest relative difference | verdict |", "|---|---|---:|---|"]
    for entry in doc["strategies"]:
        if entry["name"] == doc["reference"]:
            continue
        wrong = entry["description"] if entry["name"] in WRONG else "nothing (built in)"
        diff = "n/a" if entry["max_rel_loss_diff"] is None else f"{entry['max_rel_loss_diff']:.1e}"
        rows.append(f"| `{entry['name']}` | {wrong} | {diff} | {entry['verdict'] or entry['status']} |")
    return rows


def smallest_caught(doc: dict) -> str:
    kinds = {e["name"]: e.get("verdict_kind") for e in doc["strategies"]}
    caught = [e for e in LR_ERRORS if kinds.get(lr_error_name(e)) == "differs"]
    missed = [e for e in LR_ERRORS if kinds.get(lr_error_name(e)) in ("matches", "within noise")]
    if not caught:
        return "no learning-rate error here was caught"
    if min(caught) == min(LR_ERRORS):
        return f"every learning-rate error tried was caught, down to {min(caught):.2%}, the smallest tried"
    below = f"; {max(missed):.2%} was not" if missed and max(missed) < min(caught) else ""
    return f"the smallest learning-rate error caught: {min(caught):.2%}{below}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--built-ins", action="store_true", help="every built-in strategy too (the GPU acceptance run)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "verdict_sensitivity.md"))
    p.add_argument("--work-dir", default=str(ROOT / "runs" / "verdict_sensitivity"))
    args = p.parse_args(own)
    work = Path(args.work_dir)
    site = entry_points(work / "site")
    strategies = (built_in_names() if args.built_ins else ["single"]) + WRONG
    command = shlex.join(["python", "bench/verdict_sensitivity.py", *argv])
    lines = [f"## {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}", "", f"Command: `{command}`", ""]
    for precision in args.precisions.split(","):
        doc = run_compare(precision, strategies, passthrough, work, site)
        env = doc["environment"]
        band = (doc.get("noise") or {}).get("band")
        lines += [
            f"### {precision} on {doc['nproc']} x {env['device']} ({doc['model']['name']}, "
            f"{doc['config']['steps']} steps)",
            "",
            f"Versions: {', '.join(f'{k} {v}' for k, v in env['versions'].items() if v)}. Rule: "
            f"{band['rule'] if band else 'fixed tolerance ' + str(doc['tolerance'])}. Noise runs strayed up to "
            f"{max(band['spread']):.1e}."
            if band
            else "",
            "",
            *table(doc),
            "",
            f"Result: {smallest_caught(doc)}.",
            "",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# The smallest error the loss verdict catches\n\nEach section is bench/verdict_sensitivity.py's "
        "own output, with the command that made it.\n\n"
    )
    out.write_text((out.read_text() if out.exists() else header) + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
