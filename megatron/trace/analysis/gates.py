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

A goodput the trace can only bound (a SIGKILL lost the spans its ranks had not
exported: the report's ``bounds``) is judged on its bounds: a pass when even the
lower bound reaches the threshold, a failure when even the upper one is under it,
and exit 2 only when they straddle it, with one line giving both. The median
iteration time ``diff --fail-if-slower`` reads is not a bound (the median of the
iterations each file holds) and is judged as it is.
"""

from __future__ import annotations

from typing import Any

from megatron.trace.analysis.reasons import reason_text
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
    bounds = report.get("bounds", {})
    if "goodput_s" in bounds or "wall_s" in bounds:
        return _bounded_gate(bounds, wall, bound_pct)
    # goodput / wall < bound / 100, without rounding either side
    if goodput * 100 >= bound_pct * wall:
        return None
    value = 100 * goodput / wall if wall else 0.0
    return (
        f"goodput {percent_text(value, bound_pct)} % is under --fail-under-goodput {bound_pct:g} %"
    )


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def _bounded_gate(bounds: dict[str, Any], wall: int, bound_pct: float) -> str | None:
    """:func:`goodput_gate` on a goodput the report bounds (module doc)."""
    goodput = bounds.get("goodput_s", {})
    low, high = _ns(goodput.get("lower")), _ns(goodput.get("upper"))
    if "wall_s" in bounds:  # the job's end is unknown: its share of the wall clock too
        low = high = None
    reason = reason_text((bounds.get("goodput_s") or bounds["wall_s"])["reason"])
    lower = 100 * low / wall if low is not None and wall else 0.0
    upper = 100 * high / wall if high is not None and wall else 100.0
    if low is not None and low * 100 >= bound_pct * wall:
        return None
    if high is not None and high * 100 < bound_pct * wall:
        return (
            f"goodput at most {percent_text(upper, bound_pct)} % (between "
            f"{percent_text(lower, bound_pct)} and {percent_text(upper, bound_pct)} %: {reason}) "
            f"is under --fail-under-goodput {bound_pct:g} %"
        )
    raise TraceInputError(
        f"--fail-under-goodput cannot judge: goodput between {percent_text(lower, bound_pct)} "
        f"and {percent_text(upper, bound_pct)} % straddles {bound_pct:g} % ({reason})"
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
