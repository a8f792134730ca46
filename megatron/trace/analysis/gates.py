"""Gates for CI: whether a figure crossed the bound a flag set, and the one line saying so.

``report --fail-under-goodput PCT`` and ``diff --fail-if-slower PCT`` exit 1
when their bound is crossed (a finding, like a ``check`` violation), with
one line naming the figure, its value, the flag and the bound. Each gate is
a function of the figures alone (the report, or the diff), so it is tested
without a command line. A gate on a figure the trace cannot give is not a
pass: it raises :class:`~megatron.trace_format.errors.TraceInputError` (exit 2)
with the reason.

The comparison is exact, on the figures the JSON holds (the goodput in
integer nanoseconds, the medians in ms): the gate fails exactly when the
figure is past the bound, never when it equals it. The line prints the
figure with as many decimals as it takes to differ from the bound, so it
never reads ``80.0 % is under 80 %``.
"""

from __future__ import annotations

from typing import Any

from megatron.trace_format.errors import TraceInputError
from megatron.trace_format.semconv import Category

__all__ = ["goodput_gate", "percent_text", "slower_gate"]


def percent_text(value: float, bound: float, decimals: int = 1) -> str:
    """``value`` with ``decimals`` decimals, or more (up to 6) until it differs from ``bound``."""
    for places in range(decimals, 7):
        text = f"{value:.{places}f}"
        if float(text) != bound:
            return text
    return f"{value:.6f}"


def goodput_gate(report: dict[str, Any], bound_pct: float) -> str | None:
    """The line saying the goodput is under ``bound_pct`` %, or None when it is not."""
    if any(reason.startswith(f"{Category.GOODPUT}:") for reason in report["not_computed"]):
        reason = next(r for r in report["not_computed"] if r.startswith(f"{Category.GOODPUT}:"))
        raise TraceInputError(f"--fail-under-goodput cannot judge: not computed: {reason}")
    exact = report["accounting_ns"]
    wall, goodput = exact["wall"], exact[Category.GOODPUT]
    # goodput / wall < bound / 100, without rounding either side
    if goodput * 100 >= bound_pct * wall:
        return None
    value = 100 * goodput / wall if wall else 0.0
    return (
        f"goodput {percent_text(value, bound_pct)} % is under --fail-under-goodput {bound_pct:g} %"
    )


def slower_gate(diff: dict[str, Any], bound_pct: float) -> str | None:
    """The line saying B's median iteration time is more than ``bound_pct`` % above A's,
    or None when it is not."""
    median = diff["iterations"]["median_ms"]
    a, b = median["a"], median["b"]
    if a is None or b is None:
        missing = " and ".join(side.upper() for side in ("a", "b") if median[side] is None)
        raise TraceInputError(
            f"--fail-if-slower cannot judge: the median iteration time of {missing} is not "
            "computed (no megatron.train.iteration spans: enable the per_step span groups)"
        )
    # b > a * (1 + bound / 100)
    if b * 100 <= a * (100 + bound_pct):
        return None
    slower = 100 * (b - a) / a if a else float("inf")
    return (
        f"median iteration time {b:g} ms (B) is {percent_text(slower, bound_pct)} % above "
        f"{a:g} ms (A), over --fail-if-slower {bound_pct:g} %"
    )
