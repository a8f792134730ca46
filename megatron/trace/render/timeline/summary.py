"""The goodput summary at the top of the timeline page: ``report``'s figures, drawn.

The page answers "where did the time go" twice: the lanes show *when*, this
summary shows *how much*, from the very dict ``megatron-trace report --json``
prints (:func:`megatron.trace.analysis.goodput.build_report`), so the page and the
report can never disagree. One stacked bar splits the wall clock into
goodput and the badput categories, in the lanes' colours; a line of text
gives the figures a reader quotes.
"""

from __future__ import annotations

import html
from typing import Any

from megatron.trace.analysis.reasons import reason_text, reasons_once
from megatron.trace.render.text.report import bound_text
from megatron.trace_format.semconv import (
    Category,
)

__all__ = ["BAR_ORDER", "CATEGORY_COLOURS", "duration_text", "summary_figure", "summary_html"]

# The report's categories in the timeline's colours (goodput is the interval green).
CATEGORY_COLOURS = {
    Category.GOODPUT: "#31a354",
    Category.QUEUE: "#9e9e9e",
    Category.LAUNCH: "#8c6d31",
    Category.STARTUP: "#3182bd",
    Category.CHECKPOINT_LOAD: "#17becf",
    Category.CHECKPOINT_SAVE: "#ff7f0e",
    Category.EVALUATION: "#9467bd",
    Category.WASTED_PROGRESS: "#d62728",
    Category.HANG: "#7b3294",
    Category.RESTART_GAP: "#cfcfcf",
    Category.OTHER: "#f0f0f0",
}


#: The bar's order, left to right: the order a job's life meets them (queued, launched,
#: started, loaded, trained with saves and evaluations, then what was lost), so startup
#: sits at the left end, where the lanes below have it.
BAR_ORDER = (
    Category.QUEUE,
    Category.LAUNCH,
    Category.STARTUP,
    Category.CHECKPOINT_LOAD,
    Category.GOODPUT,
    Category.CHECKPOINT_SAVE,
    Category.EVALUATION,
    Category.HANG,
    Category.WASTED_PROGRESS,
    Category.RESTART_GAP,
    Category.OTHER,
)


def _shares(report: dict[str, Any]) -> list[tuple[str, float]]:
    """(category, seconds) for goodput and every badput category that took time, in
    :data:`BAR_ORDER` (a category not listed there last, in the report's order)."""
    seconds_of = {Category.GOODPUT: report["goodput_s"], **report["badput_s"]}
    order = [*BAR_ORDER, *(name for name in seconds_of if name not in BAR_ORDER)]
    return [(name, seconds_of[name]) for name in order if seconds_of.get(name)]


def summary_figure(report: dict[str, Any]) -> Any:
    """One horizontal bar, the wall clock split by category (plotly figure)."""
    import plotly.graph_objects as go

    wall = report["wall_s"] or 1.0
    bounds = report.get("bounds", {})
    fig = go.Figure()
    for name, seconds in _shares(report):
        percent = 100 * seconds / wall
        label = name.replace("_", " ")
        bound = bounds.get("goodput_s" if name == Category.GOODPUT else f"badput_s.{name}")
        # the bar is the booking (it sums to the wall clock); a bounded share says so
        between = f"<br>between {bound_text(None, bound)} s (bounded)" if bound else ""
        fig.add_trace(
            go.Bar(
                name=label,
                orientation="h",
                y=["wall clock"],
                x=[seconds],
                marker={"color": CATEGORY_COLOURS[name], "line": {"color": "#888", "width": 0.5}},
                text=[f"{label} {percent:.0f}%"],
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                hovertext=[
                    f"<b>{label}</b><br>{seconds:.3f} s<br>{percent:.1f} % of wall clock{between}"
                ],
                hoverinfo="text",
                showlegend=False,
            )
        )
    fig.update_layout(
        barmode="stack",
        height=90,
        margin={"l": 10, "r": 20, "t": 5, "b": 30},
        uniformtext={"minsize": 10, "mode": "hide"},
        plot_bgcolor="white",
        font={"family": "Helvetica, Arial, sans-serif", "size": 13},
        xaxis={"title": {"text": "seconds", "standoff": 2}, "range": [0, wall]},
        yaxis={"showticklabels": False},
    )
    return fig


def summary_html(report: dict[str, Any]) -> str:
    """The figures, as a few ``<span>`` items: goodput, largest badput, waste, iterations.

    A figure the report can only bound (a SIGKILL kept part of the job from the file)
    is shown as its bound, as ``report`` prints it, and each reason once below."""
    wall = report["wall_s"]
    bounds = report.get("bounds", {})

    def percent(seconds: float, path: str) -> str:
        if not wall:
            return "-"
        if "wall_s" in bounds:  # a share of a whole that is itself only bounded
            return "? %"
        bound = bounds.get(path)
        if bound is None:
            return f"{100 * seconds / wall:.1f} %"
        scaled = {
            side: None if bound[side] is None else 100 * bound[side] / wall
            for side in ("lower", "upper")
        }
        return f"{bound_text(None, scaled, '.1f')} %"

    def seconds_text(seconds: float, path: str) -> str:
        bound = bounds.get(path)
        return duration_text(seconds) if bound is None else f"{bound_text(None, bound)} s"

    items = []
    if report.get("running"):
        items.append(f"<b>running</b>: figures as of {html.escape(str(report['as_of']))}")
    items += [
        f"wall clock <b>{seconds_text(wall, 'wall_s')}</b>",
        f"goodput <b>{percent(report['goodput_s'], 'goodput_s')}</b> "
        f"({seconds_text(report['goodput_s'], 'goodput_s')})",
    ]
    computed = [(name, s) for name, s in report["badput_s"].items() if s is not None]
    badput = sorted(computed, key=lambda item: -item[1])
    # the three largest that show at one decimal (0.0 % says nothing)
    shown = [(name, s) for name, s in badput if wall and 1000 * s / wall >= 0.5][:3]
    largest = [f"{name.replace('_', ' ')} {percent(s, f'badput_s.{name}')}" for name, s in shown]
    if largest:
        items.append("largest badput: " + ", ".join(largest))
    wasted = bound_text(report["wasted_iterations"], bounds.get("wasted_iterations"), "d")
    items.append(f"wasted iterations <b>{wasted}</b>")
    stats = report.get("iterations")
    if stats:
        anomalous = stats["anomalous"]
        items.append(
            f"iteration median {stats['median_ms']:.1f} ms, p90 {stats['p90_ms']:.1f} ms, "
            f"max {stats['max_ms']:.1f} ms; "
            f"{'?' if anomalous['count'] is None else anomalous['count']} anomalous "
            f"({html.escape(anomalous['rule'])})"
        )
    found = report.get("stragglers")
    if found is not None:
        names = ", ".join(
            f"rank {html.escape(str(entry['rank']))} (score {entry['score']:.2f})"
            for entry in report["ranks"]
            if entry.get("straggler")
        )
        items.append(
            f"stragglers <b>{names or 'none'}</b>, "
            f"{seconds_text(report['straggler_s'], 'straggler_s')} lost waiting for them"
        )
    for hang in report.get("hangs", []):
        role = "culprit" if hang["culprit"] else "waiting"
        items.append(
            f"hang: rank {html.escape(str(hang['rank']))} ({role}) "
            f"<b>{duration_text(hang['stalled_s'])}</b> after iteration {hang['last_iteration']}"
        )
    if len(report.get("ranks", [])) > 1:
        items.append(f"figures of rank {html.escape(str(report['rank']))}")
    spans = "".join(f"<span>{item}</span>" for item in items)
    notes = "".join(
        f"<div class='note'>not computed: {html.escape(reason)}</div>"
        for reason in report.get("not_computed", [])
    )
    notes += "".join(
        f"<div class='note'>bounded: {html.escape(reason_text(reason))}</div>"
        for reason in reasons_once(bound["reason"] for bound in bounds.values())
    )
    return f"<div class='summary'>{spans}</div>{notes}"


def duration_text(seconds: float) -> str:
    """A duration as a reader wants it: h, min, s or ms, three significant-ish digits."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"
