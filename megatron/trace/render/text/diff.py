"""The text of ``megatron-trace diff``: two runs' figures side by side, with B - A.

The figures are :func:`megatron.trace.analysis.diff.build_diff`'s; this module
only lays them out. A figure one side cannot give is ``?`` (see "not computed").
"""

from __future__ import annotations

from typing import Any

from megatron.trace_format.semconv import BADPUT_CATEGORIES, STARTUP_PHASE_PREFIX, Category
from megatron.trace_format.words import counted

__all__ = ["format_diff"]


def _num(value: float | None, spec: str, signed: bool = False) -> str:
    if value is None:
        return "?"
    return format(value, ("+" if signed else "") + spec)


def _side_line(name: str, side: dict[str, Any]) -> str:
    files = side["files"]
    shown = ", ".join(files[:3]) + (f", … ({len(files)} files)" if len(files) > 3 else "")
    iterations = (
        "? iterations" if side["iterations"] is None else counted(side["iterations"], "iteration")
    )
    return (
        f"{name}: {shown}  (rank {side['rank']}, {counted(side['incarnations'], 'incarnation')}, "
        f"{iterations}, {counted(side['spans'], 'span')}"
        + (", running" if side["running"] else "")
        + ")"
    )


def _amount(amount: dict[str, Any], signed: bool = False) -> str:
    return (
        f"{_num(amount['s'], '.3f', signed):>10} {_num(amount['pct'], '.1f', signed):>6} "
        f"{_num(amount['per_iteration_s'], '.3f', signed):>8}"
    )


def _share_line(name: str, share: dict[str, Any], width: int) -> str:
    return (
        f"{name:<{width}}{_amount(share['a'])}   {_amount(share['b'])}   "
        f"{_amount(share['delta'], signed=True)}"
    )


def _figure_line(name: str, fig: dict[str, Any], spec: str, unit: str, width: int) -> str:
    relative = "" if fig["delta_pct"] is None else f"  {fig['delta_pct']:+.1f} %"
    return (
        f"{name:<{width}}{_num(fig['a'], spec):>12} {unit:<3}  "
        f"{_num(fig['b'], spec):>12} {unit:<3}  "
        f"{_num(fig['delta'], spec, signed=True):>12} {unit}{relative}"
    )


def _ranks(ranks: list[Any] | None) -> str:
    if ranks is None:
        return "?"
    return ", ".join(f"rank {rank}" for rank in ranks) or "none"


def format_diff(diff: dict[str, Any]) -> str:
    """The diff as a few human-readable lines (the names' column as wide as the widest
    name, a startup phase's included, so every figure stands in its column)."""
    phases = diff["startup_phases"]
    names = [
        "time lost",
        *(f"  {c}" for c in BADPUT_CATEGORIES),
        *(f"  {name.removeprefix(STARTUP_PHASE_PREFIX)}" for name in phases or ()),
    ]
    width = max(17, *(len(name) + 1 for name in names))
    lines = [_side_line("A", diff["a"]), _side_line("B", diff["b"])]
    lines.append(f"{'':{width}}{'A':>12}       {'B':>12}       {'B - A':>12}")
    lines.append(_figure_line("wall clock", diff["wall_s"], ".3f", "s", width))
    lines.append(_figure_line("progress", diff["progress_iterations"], ".0f", "it", width))
    lines.append(
        "per category: seconds, % of the wall clock (1 % = 36 s per hour; B - A in points), "
        "seconds per iteration of progress"
    )
    head = f"{'s':>10} {'%':>6} {'s/it':>8}"
    lines.append(f"{'':{width}}{head}   {head}   {head}")
    lines.append(_share_line("goodput", diff["goodput"], width))
    lines.append("badput:")
    lines += [_share_line(f"  {c}", diff["badput"][c], width) for c in BADPUT_CATEGORIES]
    lines.append("iteration time:")
    lines.append(_figure_line("  median", diff["iterations"]["median_ms"], ".1f", "ms", width))
    lines.append(_figure_line("  p90", diff["iterations"]["p90_ms"], ".1f", "ms", width))
    if phases:
        lines.append(f"{Category.STARTUP} phases:")
        lines += [
            _figure_line(f"  {name.removeprefix(STARTUP_PHASE_PREFIX)}", fig, ".3f", "s", width)
            for name, fig in phases.items()
        ]
    stragglers = diff["stragglers"]
    lines.append(
        f"stragglers: A {_ranks(stragglers['a'])}; B {_ranks(stragglers['b'])}",
    )
    lines.append(_figure_line("  time lost", stragglers["straggler_s"], ".3f", "s", width))
    lines += [f"bounded: {line}" for line in diff["bounded"]]
    lines += [f"not computed: {reason}" for reason in diff["not_computed"]]
    return "\n".join(lines)
