"""`runner.py list`: strategies (available or not, and why), models with their sizes, and the
planner's catalogue of public models.
`runner.py list --markdown`: the strategies as a Markdown table (the README's table).
`runner.py list accelerate:mine.yaml deepspeed:ds.json`: what each config file runs as."""

from __future__ import annotations

from harness.plan import catalogue_listing
from models.zoo import describe, known_models
from strategies.float8 import fp8_unavailable_reason
from strategies.registry import StrategyEntry, StrategyRegistry, default_registry


def _as_typed(value: object) -> str:
    """A default as one would type it on the command line."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def strategy_table(registry: StrategyRegistry) -> list[str]:
    """Every name of `registry` as a row: what it is and the options a run may set."""
    rows = ["| strategy | what it is | options (`strategy_options.<name>=`) |", "|---|---|---|"]
    for entry in registry.entries():
        options = ", ".join(f"`{name}`" for name in entry.user_options()) or "-"
        rows.append(f"| `{entry.name}` | {entry.description} | {options} |")
    return rows


def fp8_lines(registry: StrategyRegistry) -> list[str]:
    """precision=fp8 on this machine's device, and which strategies train it."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reason = fp8_unavailable_reason(device)
    if reason:
        status = f"unavailable: {reason}"
    elif device.type == "cpu":
        status = "available on the CPU as float8's numerics, without its speed"
    else:
        status = "available"
    names = [entry.name for entry in registry.entries() if entry.cls is not None and entry.fp8_refusal() is None]
    return [
        "precision=fp8 (the blocks' linear layers in float8, torchao):",
        f"  [{status}]",
        f"  trained by: {', '.join(names)}; the others say why",
    ]


def status(entry: StrategyEntry, device_type: str) -> str:
    """Whether `entry` runs here: unavailable (a missing package), unavailable on this machine's device
    (what a compare skips it for there), or available."""
    reason = entry.unavailable_reason
    if reason is not None:
        return f"unavailable: {reason}"
    unsupported = entry.unsupported_reason(device_type)
    return "available" if unsupported is None else f"unavailable on this device ({device_type}): {unsupported}"


def main(args: list[str]) -> int:
    if args == ["--markdown"]:
        print("\n".join(strategy_table(default_registry())))
        return 0
    if args:
        return _config_files(args)
    import torch

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    print("strategies:")
    for entry in default_registry().entries():
        print(f"  {entry.name:<18} {entry.description}  [{status(entry, device_type)}]")
        options = entry.user_options()
        if options:
            print(f"  {'':<18} strategy_options: {', '.join(f'{k}={_as_typed(v)}' for k, v in options.items())}")
    print("\n".join(fp8_lines(default_registry())))
    print("models:")
    for name in known_models():
        info = describe(name)
        shape = (
            f"  L={info['n_layer']} H={info['n_head']} C={info['n_embd']} V={info['vocab_size']}"
            if "n_layer" in info
            else ""
        ) + (f" experts={info['n_experts']} top-{info['top_k']}" if "n_experts" in info else "")
        print(f"  {name:<18} {info['params'] / 1e6:>10.2f}M {'active ' if 'n_experts' in info else ''}params{shape}")
    print("  any user model as model=package.module:build (with model_kwargs.<name>=<value>)")
    print("planner catalogue (runner.py plan model=<name>; each one's sources in docs/planner.md):")
    print("\n".join(catalogue_listing()))
    print("  any Hugging Face config offline as model=hf:<dir or config.json>")
    kinds = default_registry().file_kinds()
    if kinds:
        print("config files:")
        print(f"  any {', '.join(kinds)} config file as a strategy: {', '.join(f'{k}:<file>' for k in kinds)}")
    return 0


def _config_files(names: list[str]) -> int:
    """What each `<kind>:<path>` runs as: the built-in whose class runs it and whose PlanModel plans it."""
    registry = default_registry()
    for name in names:
        entry = registry.get(name)
        if entry.config_file is None:
            raise ValueError(f"list takes --markdown or config files as <kind>:<path> (got {name})")
        reason = entry.unavailable_reason
        status = "available" if reason is None else f"unavailable: {reason}"
        print(f"{name}: {entry.description} (planned as {entry.resolves_to})  [{status}]")
    return 0
