"""Run against run: two goodput reports side by side, each figure with its delta.

``megatron-trace diff A B`` answers "did my change help?". Each side is one
run's trace (one file, or a set of rank files), accounted by
:func:`~megatron.trace.analysis.goodput.build_report` as ``report`` would;
this module only sets the two reports' figures side by side and takes
differences, so the two commands can never disagree.

Every figure is ``{"a", "b", "delta", "delta_pct"}``: ``delta`` is B - A,
``delta_pct`` is that as a per cent of A (None where A is 0). A figure one
side cannot give is None there, and so is its delta; the reason is in
``not_computed``, prefixed with the side (``A: ...``).

Runs of different lengths compare by rate, so the wall clock, goodput and
each badput category carry four figures: ``s`` (seconds), ``pct`` (per cent
of the wall clock; its delta is in percentage points), ``per_hour_s``
(seconds per hour of wall clock) and ``per_iteration_s`` (seconds per
iteration of *progress*: the iterations the run finished, less the wasted
ones it did again; None without iteration spans). Then the iteration time
(median and p90, ms), the startup's phases (seconds, summed over the job
rank's incarnations, by span name), and the stragglers (each side's flagged
ranks, and ``straggler_s``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any, TypedDict

from megatron.trace.analysis.report import Report
from megatron.trace.model.incarnation import Trace
from megatron.trace_format.semconv import BADPUT_CATEGORIES

__all__ = [
    "Amount",
    "Diff",
    "Figure",
    "IterationFigures",
    "Share",
    "SideEntry",
    "StragglerFigures",
    "build_diff",
    "figure",
    "schema",
    "startup_phases",
]

_HOUR_S = 3600.0


class Figure(TypedDict):
    """One figure of both runs: A's, B's, B - A, and that as a per cent of A."""

    a: float | None
    b: float | None
    delta: float | None
    delta_pct: float | None


class Amount(TypedDict):
    """A stretch of one run's wall clock: seconds, per cent of the wall clock, seconds
    per hour of wall clock, seconds per iteration of progress (None: not computed)."""

    s: float | None
    pct: float | None
    per_hour_s: float | None
    per_iteration_s: float | None


class Share(TypedDict):
    """A category in both runs, and B - A of each of its figures (``pct``: points)."""

    a: Amount
    b: Amount
    delta: Amount


class SideEntry(TypedDict):
    """Which run a side is: its files, the rank its figures are of, its size."""

    files: list[str]
    rank: int | str
    spans: int
    incarnations: int
    iterations: int | None
    progress_iterations: int | None
    running: bool


class IterationFigures(TypedDict):
    median_ms: Figure
    p90_ms: Figure


class StragglerFigures(TypedDict):
    a: list[int | str] | None
    b: list[int | str] | None
    straggler_s: Figure


class Diff(TypedDict):
    """``diff --json``: A's and B's figures side by side (``diff.schema.json``)."""

    a: SideEntry
    b: SideEntry
    wall_s: Figure
    progress_iterations: Figure
    goodput: Share
    badput: dict[str, Share]
    iterations: IterationFigures
    startup_phases: dict[str, Figure]
    stragglers: StragglerFigures
    bounded: list[str]
    not_computed: list[str]


def _round(value: float | None, places: int = 6) -> float | None:
    return None if value is None else round(value, places)


def figure(a: float | None, b: float | None, places: int = 6) -> Figure:
    """A's and B's values, B - A, and B - A as a per cent of A."""
    if a is None or b is None:
        delta = pct = None
    else:
        delta = b - a
        pct = round(100 * delta / a, 3) if a else None
    return {
        "a": _round(a, places),
        "b": _round(b, places),
        "delta": _round(delta, places),
        "delta_pct": pct,
    }


def _progress(report: Report) -> int | None:
    """The iterations a run advanced: those it finished, less the ones it did again."""
    stats, wasted = report["iterations"], report["wasted_iterations"]
    if stats is None or wasted is None:
        return None
    return max(0, stats["count"] - wasted)


def _amount(seconds: float | None, report: Report) -> Amount:
    wall, progress = report["wall_s"], _progress(report)
    if seconds is None:
        return {"s": None, "pct": None, "per_hour_s": None, "per_iteration_s": None}
    return {
        "s": round(seconds, 9),
        "pct": round(100 * seconds / wall, 6) if wall else None,
        "per_hour_s": round(_HOUR_S * seconds / wall, 6) if wall else None,
        "per_iteration_s": round(seconds / progress, 9) if progress else None,
    }


def _share(a_s: float | None, a: Report, b_s: float | None, b: Report) -> Share:
    one, two = _amount(a_s, a), _amount(b_s, b)
    delta = {
        key: None if one[key] is None or two[key] is None else round(two[key] - one[key], 9)  # type: ignore[literal-required,operator]
        for key in one
    }
    return {"a": one, "b": two, "delta": delta}  # type: ignore[typeddict-item]


def startup_phases(trace: Trace) -> dict[str, float]:
    """Seconds per startup phase (``megatron.startup.*`` span name) of the job rank, summed
    over its incarnations, in the order the phases first appear."""
    phases: dict[str, int] = {}
    incs = next(iter(trace.ranks.values()), [])
    for inc in incs:
        for record in sorted(inc.startup_phases, key=lambda r: r["start_ns"]):
            name = record["name"]
            phases[name] = phases.get(name, 0) + record["end_ns"] - record["start_ns"]
    return {name: ns / 1e9 for name, ns in phases.items()}


def _side(files: Sequence[Any], report: Report) -> SideEntry:
    stats = report["iterations"]
    return {
        "files": [str(f) for f in files],
        "rank": report["rank"],
        "spans": report["spans"],
        "incarnations": len(report["incarnations"]),
        "iterations": stats["count"] if stats is not None else None,
        "progress_iterations": _progress(report),
        "running": report["running"],
    }


def _ms(report: Report, key: str) -> float | None:
    stats = report["iterations"]
    return None if stats is None else stats[key]  # type: ignore[literal-required]


def build_diff(
    a: tuple[Sequence[Any], Trace, Report], b: tuple[Sequence[Any], Trace, Report]
) -> Diff:
    """A's and B's figures side by side, each side ``(files, trace, report)`` (the report
    :func:`~megatron.trace.analysis.goodput.build_report` of the trace); see the module
    docstring."""
    (a_files, a_trace, ra), (b_files, b_trace, rb) = a, b
    not_computed = [f"A: {reason}" for reason in ra["not_computed"]]
    not_computed += [f"B: {reason}" for reason in rb["not_computed"]]
    for side, report in (("A", ra), ("B", rb)):
        if _progress(report) is None:
            not_computed.append(
                f"{side}: per_iteration_s: no iteration count (no megatron.train.iteration "
                "spans, or wasted iterations unknown)"
            )
    bounded = [
        f"{side}: {', '.join(sorted(report['bounds']))} can only be bounded (report on its "
        "files gives the bounds and why); the figures here are its booked ones"
        for side, report in (("A", ra), ("B", rb))
        if report.get("bounds")
    ]
    a_phases, b_phases = startup_phases(a_trace), startup_phases(b_trace)
    a_stragglers, b_stragglers = ra["stragglers"], rb["stragglers"]
    return {
        "a": _side(a_files, ra),
        "b": _side(b_files, rb),
        "wall_s": figure(ra["wall_s"], rb["wall_s"], 9),
        "progress_iterations": figure(_progress(ra), _progress(rb)),
        "goodput": _share(ra["goodput_s"], ra, rb["goodput_s"], rb),
        "badput": {
            category: _share(ra["badput_s"][category], ra, rb["badput_s"][category], rb)
            for category in BADPUT_CATEGORIES
        },
        "iterations": {
            "median_ms": figure(_ms(ra, "median_ms"), _ms(rb, "median_ms"), 3),
            "p90_ms": figure(_ms(ra, "p90_ms"), _ms(rb, "p90_ms"), 3),
        },
        "startup_phases": {
            name: figure(a_phases.get(name), b_phases.get(name), 9)
            for name in {**a_phases, **b_phases}
        },
        "stragglers": {
            "a": None if a_stragglers is None else list(a_stragglers["ranks"]),
            "b": None if b_stragglers is None else list(b_stragglers["ranks"]),
            "straggler_s": figure(ra["straggler_s"], rb["straggler_s"], 9),
        },
        "bounded": bounded,
        "not_computed": not_computed,
    }


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of ``diff --json`` (``diff.schema.json``, shipped in the package)."""
    text = resources.files(__package__).joinpath("diff.schema.json").read_text("utf-8")
    return json.loads(text)
