"""The report's last word: which strategy to pick, drawn from the measurements alone.

Only strategies whose loss matches the reference are recommended; among them the
fastest and the one that holds the least memory per rank. Strategies to avoid are
those that failed, whose loss differs from the reference's, or that are beaten on both speed and
memory by another.
"""

from __future__ import annotations

from harness.common.units import human_bytes
from harness.compare import StrategyResult

# Throughput differences under this are noise on a shared machine: no "dominated" verdict for them.
SPEED_MARGIN = 1.25


def memory_per_rank(r: StrategyResult, device_type: str) -> float | None:
    """Peak allocated on GPU; on CPU, where no peak is measured, the model states."""
    if device_type == "cuda" and r.peak_mem_allocated_bytes:
        return float(r.peak_mem_allocated_bytes)
    return float(r.model_state_bytes) if r.model_state_bytes is not None else None


def advice_from_results(results: list[StrategyResult], device_type: str) -> list[str]:
    """Sentences, best advice first."""
    ran = [r for r in results if r.ran]
    if not ran:
        return ["No strategy finished, so there is nothing to recommend: see the failures above and their logs."]
    good = [r for r in ran if r.matches_reference and r.tokens_per_s]
    advice = []
    memory_word = "peak memory" if device_type == "cuda" else "model-state memory"
    if not good:
        advice.append(
            "No strategy both finished and learned what the reference learns: explain the differing loss "
            "curves before comparing speed."
        )
    else:
        fastest = max(good, key=lambda r: r.tokens_per_s or 0)
        # Among strategies tied on memory, the fastest.
        leanest = min(good, key=lambda r: (memory_per_rank(r, device_type) or float("inf"), -(r.tokens_per_s or 0)))
        advice.append(_fastest(fastest, good))
        if fastest.name == "single" and len(ran) > 1:
            advice.append(
                "One process beats every parallel strategy here: at this model size the communication costs "
                "more than the work it shares out. Parallelism pays once the model or batch is larger, or "
                "when the model does not fit one device."
            )
        tied = [
            r.name
            for r in good
            if r is not leanest and memory_per_rank(r, device_type) == memory_per_rank(leanest, device_type)
        ]
        advice.append(_leanest(leanest, fastest, device_type, memory_word, tied))
    advice += _avoid(results, good, device_type, memory_word)
    skipped = [r.name for r in results if r.status == "skipped"]
    if skipped:
        advice.append(
            f"Not compared here ({len(skipped)} skipped, unavailable or unsupported on {device_type}): "
            + ", ".join(f"`{n}`" for n in skipped)
            + ". Their reasons are in the table above."
        )
    if device_type == "cpu":
        advice.append(
            "These figures come from CPU processes talking over gloo: they rank the strategies' overheads on "
            "this machine, not on GPUs. Run the same command on the GPU machine before choosing for GPU training."
        )
    return advice


def _fastest(fastest: StrategyResult, good: list[StrategyResult]) -> str:
    others = sorted((r for r in good if r is not fastest), key=lambda r: -(r.tokens_per_s or 0))
    versus = ""
    if others:
        runner_up = others[0]
        versus = f", {fastest.tokens_per_s / runner_up.tokens_per_s:.2f}x the next, `{runner_up.name}`"
    return f"**Fastest that matches the reference: `{fastest.name}`** at {fastest.tokens_per_s:,.0f} tokens/s{versus}."


def _leanest(
    leanest: StrategyResult, fastest: StrategyResult, device_type: str, memory_word: str, tied: list[str]
) -> str:
    lean_mem = memory_per_rank(leanest, device_type)
    also = f" (tied with {', '.join(f'`{n}`' for n in tied)}, and the fastest of them)" if tied else ""
    head = f"**Least memory per rank: `{leanest.name}`** with {human_bytes(lean_mem)} of {memory_word}{also}"
    if leanest is fastest:
        return head + ": it is also the fastest, so it is the clear choice here."
    fast_mem = memory_per_rank(fastest, device_type)
    ratio = fast_mem / lean_mem if fast_mem and lean_mem else None
    speed = leanest.tokens_per_s / fastest.tokens_per_s if fastest.tokens_per_s and leanest.tokens_per_s else None
    trade = ""
    if ratio and speed:
        trade = (
            f", {ratio:.1f}x less than `{fastest.name}` at {speed:.0%} of its speed: "
            "choose it when memory, not time, is what limits you"
        )
    return head + trade + "."


def _avoid(results: list[StrategyResult], good: list[StrategyResult], device_type: str, memory_word: str) -> list[str]:
    lines = []
    beaten = []
    for r in results:
        if r.status == "failed":
            lines.append(f"Avoid `{r.name}` as configured: it failed ({_failure(r)}).")
        elif r.ran and r.matches_reference is False:
            lines.append(f"Avoid `{r.name}` until its loss is explained: {_difference(r)}.")
        elif r in good:
            better = _dominating(r, good, device_type)
            if better is not None:
                beaten.append(f"`{r.name}` (by `{better.name}`, {better.tokens_per_s / r.tokens_per_s:.1f}x faster)")
    if beaten:
        lines.append(
            f"These buy nothing here, as another strategy is over {SPEED_MARGIN - 1:.0%} faster with no more "
            f"{memory_word} per rank: " + ", ".join(beaten) + "."
        )
    return lines


def _difference(r: StrategyResult) -> str:
    if r.first_step_differs is None:
        return r.verdict  # not comparable step by step
    past = f", {r.noise_ratio:.1f}x what a correct backend differs by" if r.noise_ratio else ""
    return (
        f"it differs from the reference by up to {r.max_rel_loss_diff:.1e} (relative) from step "
        f"{r.first_step_differs}{past}"
    )


def _failure(r: StrategyResult) -> str:
    what = {
        "oom": "out of memory",
        "timeout": "it hung past the timeout",
        "signal": "killed by a signal",
        "crash": "crashed",
    }.get(r.error_kind or "", r.error_kind or "failed")
    return f"{what}: {r.error}" if r.error else what


def _dominating(r: StrategyResult, good: list[StrategyResult], device_type: str) -> StrategyResult | None:
    mem = memory_per_rank(r, device_type)
    if mem is None or not r.tokens_per_s:
        return None
    for other in sorted(good, key=lambda o: -(o.tokens_per_s or 0)):
        other_mem = memory_per_rank(other, device_type)
        if (
            other is not r
            and other_mem is not None
            and other_mem <= mem
            and (other.tokens_per_s or 0) > r.tokens_per_s * SPEED_MARGIN
        ):
            return other
    return None
