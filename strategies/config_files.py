"""A user's own backend config file as a strategy: `accelerate:<file.yaml>`, `deepspeed:<file.json>`.

A strategy class that can run a kind of file declares `config_file_kind` and
`resolve_config_file` (strategies/base.py); the registry then answers `<kind>:<path>` with the
built-in name the file amounts to (accelerate-fsdp, zero2, ...): its class runs the run, handed
the file in RunContext.config_file, and its PlanModel plans it. The file is read again by every
process that needs it, so an edited file is what runs (and, to a compare, a changed configuration).

What a file says is checked against the run when the strategy is constructed (preflight, then
each worker): what contradicts the comparison (another precision, another global batch, an
"auto" nothing can fill) is a one-line error naming the key and what to change; what parabench
can follow (the file's own split of the global batch into micro-batches, its process count
against the compare's) is followed, and said in the strategy's `followed` lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from strategies.base import RunContext, StrategyError

SEPARATOR = ":"


@dataclass(frozen=True)
class FileChoice:
    """What a config file amounts to, from its content alone."""

    builtin: str  # the registered name whose class runs it and whose PlanModel plans it
    summary: str  # in words, for `runner.py list` and the report: "FSDP v2, one unit per Block"
    options: dict[str, Any] = field(default_factory=dict)  # the built-in's options the file fixes (shard_size)
    plan_changes: dict[str, Any] = field(default_factory=dict)  # PlanModel fields the file sets otherwise
    # Other files the file names, by the key that names them: their content is part of the configuration.
    files: dict[str, Path] = field(default_factory=dict)
    # RunConfig keys the file sets for the whole run (a DeepSpeed JSON's scheduler: lr_schedule, warmup_type),
    # and what sets them, in words: every strategy of a compare that leaves them unset trains with them.
    run_settings: dict[str, Any] = field(default_factory=dict)
    run_settings_from: str = ""
    # The file's key each of `options` comes from: an error about the size names what the user wrote.
    option_keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigFile:
    """A strategy given as `<kind>:<path>`, resolved."""

    kind: str  # "accelerate", "deepspeed"
    path: Path  # as given (relative to the directory parabench runs from)
    choice: FileChoice

    @property
    def spec(self) -> str:
        return f"{self.kind}{SEPARATOR}{self.path}"

    @property
    def label(self) -> str:
        """How errors and notes name the file: the path as given."""
        return f"{self.kind}{SEPARATOR}{self.path}"

    def named_in_file(self, message: str) -> str:
        """A layout's error about an option the file fixes (`strategy_options.tp_size=4 does not
        divide the world size 2`), led by the file's own key for it: the user set no strategy_options,
        and the fix is in the file. Other messages as they are."""
        for option, key in self.choice.option_keys.items():
            written = f"strategy_options.{option}="
            if written in message:
                value = self.choice.options[option]
                return f"{self.label} sets {key}: {value}, run as {written}{value} (change it in the file): {message}"
        return message


def split_spec(name: str) -> tuple[str, str] | None:
    """(kind, path) of a name written `<kind>:<path>`, or None for any other name."""
    kind, sep, path = name.partition(SEPARATOR)
    return (kind, path) if sep and kind and SEPARATOR not in kind else None


def follow_batch_split(
    ctx: RunContext, *, micro_batch: int | None, grad_accum: int | None, keys: tuple[str, str], where: str
) -> tuple[RunContext, str | None]:
    """The run's context with the file's split of each rank's share of the global batch
    (`micro_batch` sequences x `grad_accum` micro-steps; None: the file leaves it to the run),
    and a line saying what was followed (None: nothing changed). `keys` name the two settings in
    the file. A split the run fixed itself (micro_batch=, grad_accum=) must agree; a split that does
    not make the run's global batch is refused."""
    micro_key, accum_key = keys
    share = ctx.micro_batch * ctx.grad_accum  # sequences per rank and step
    batch = getattr(ctx.config, "batch_size", None) or share * ctx.world_size
    ranks = batch // share
    if micro_batch is None and grad_accum is None:
        return ctx, None
    for key, value in ((micro_key, micro_batch), (accum_key, grad_accum)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise StrategyError(f'{where} sets {key}={value!r}: give a whole number of at least 1, or "auto"')
    if micro_batch is not None and grad_accum is not None:
        if micro_batch * grad_accum != share:
            raise StrategyError(
                f"{where} sets {micro_key}={micro_batch} x {accum_key}={grad_accum} = {micro_batch * grad_accum} "
                f"sequences per rank, but the global batch {batch} over {ranks} ranks is {share} each: set them to "
                f'multiply to {share}, or to "auto"'
            )
    elif grad_accum is not None:
        if share % grad_accum:
            raise StrategyError(
                f"{where} sets {accum_key}={grad_accum}, which does not divide the {share} sequences each of {ranks} "
                f'ranks takes of the global batch {batch}: set a divisor of {share}, or "auto"'
            )
        micro_batch = share // grad_accum
    else:
        assert micro_batch is not None
        if share % micro_batch:
            raise StrategyError(
                f"{where} sets {micro_key}={micro_batch}, which does not divide the {share} sequences each of "
                f'{ranks} ranks takes of the global batch {batch}: set a divisor of {share}, or "auto"'
            )
        grad_accum = share // micro_batch
    if (micro_batch, grad_accum) == (ctx.micro_batch, ctx.grad_accum):
        return ctx, None
    config = ctx.config
    if config is not None and (config.micro_batch is not None or config.grad_accum is not None):
        raise StrategyError(
            f"{where} splits each rank's batch as {micro_batch} x {grad_accum} micro-steps ({micro_key}, {accum_key}) "
            f"but the run asks {ctx.micro_batch} x {ctx.grad_accum}: drop micro_batch= and grad_accum= to follow the "
            'file, or set those keys to "auto" in it'
        )
    followed = (
        f"followed its {accum_key}={grad_accum}: micro-batch {micro_batch} x {grad_accum} micro-steps x {ranks} "
        f"ranks = the global batch {batch}"
    )
    return replace(ctx, micro_batch=micro_batch, grad_accum=grad_accum), followed
