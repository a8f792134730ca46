"""``megatron-trace timeline``: one self-contained HTML page that shows where a job's time went.

A Gantt chart, one lane per incarnation (and per rank when the files hold
several): the scheduler queue, the launch and startup phases, every
checkpoint interval, checkpoint loads and saves, evaluations, the gaps
between incarnations and how each incarnation ended (shut down, cut short by
SIGTERM, killed) with the progress each one lost. Hovering a bar shows the
span's name, duration, iteration range and attributes.

Drawn with plotly (the ``trace`` extra) and with plotly.js embedded in the
page, so it opens offline and can be mailed around. Per-step spans are not
drawn (a day-long job has millions); only their iteration numbers are kept,
to say what a killed interval had done.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from megatron.trace.lanes import Lane, LaneIndex
from megatron.trace.model import Incarnation, SpanRecord, TraceBuilder
from megatron.trace.report import build_report, rank_accounting
from megatron.trace.spans import SpanSource, TraceInputError, span_source
from megatron.trace.timeline_summary import summary_figure, summary_html

__all__ = [
    "PLOTLY_MISSING",
    "Timeline",
    "add_parser",
    "collect",
    "render_html",
    "run",
    "write_beside_trace",
    "write_page",
]

PLOTLY_MISSING = (
    "megatron-trace timeline: error: plotly is not installed; "
    "pip install 'megatron-telemetry-spans[trace]'"
)

# Categories, in legend and drawing order: (key, legend label, colour).
# Later ones are drawn on top, so nested spans stay visible over their parents.
CATEGORIES = (
    ("queue", "scheduler queue", "#9e9e9e"),
    ("restart_gap", "restart gap", "#cfcfcf"),
    ("startup", "startup, between phases", "#c6dbef"),
    ("launch", "launch, container", "#8c6d31"),
    ("startup_phase", "startup phase", "#3182bd"),
    ("interval", "training interval", "#31a354"),
    ("wasted", "wasted progress", "#d62728"),
    ("checkpoint_load", "checkpoint load", "#17becf"),
    ("checkpoint_save", "checkpoint save", "#ff7f0e"),
    ("evaluation", "evaluation", "#9467bd"),
)
_NESTED = {"checkpoint_load", "checkpoint_save", "evaluation"}
# Markers above the lane (checkpoints) and below it (evaluations): the two often
# happen in the same millisecond, so they must not share a spot. Rows grow downwards.
_MARKER_OFFSET = {"checkpoint_load": -0.38, "checkpoint_save": -0.38, "evaluation": 0.38}
_PATTERNED = {"restart_gap": "/"}
_LAUNCH = {"megatron.startup.launch_script", "megatron.startup.container_load"}
_SIMPLE = {
    "pre_startup": "queue",
    "megatron.startup": "startup",
    "megatron.train": "interval",
    "megatron.checkpoint.load": "checkpoint_load",
    "megatron.checkpoint.save": "checkpoint_save",
    "megatron.evaluate": "evaluation",
}
_MAX_ATTRIBUTES = 16


@dataclass
class Bar:
    """One drawn span (or derived stretch: a restart gap, wasted progress)."""

    lane: Lane
    category: str
    name: str
    start_ns: int
    end_ns: int
    text: str = ""
    details: list[str] = field(default_factory=list)


@dataclass
class LaneSummary:
    """What the page says about one lane beside its bars."""

    lane: Lane
    start_ns: int
    end_ns: int
    ended: str = "shutdown"  # the model's: shutdown, cut_short, killed
    cut_short: list[str] = field(default_factory=list)  # names of the spans cut short


@dataclass
class Timeline:
    """Everything the page draws, collected in one pass over the spans."""

    bars: list[Bar]
    lanes: list[LaneSummary]
    several_ranks: bool
    spans: int
    files: list[str]
    report: dict[str, Any] | None = None  # build_report's dict: the summary at the top

    @property
    def wall_ns(self) -> int:
        if not self.lanes:
            return 0
        return max(s.end_ns for s in self.lanes) - min(s.start_ns for s in self.lanes)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``timeline`` on the ``megatron-trace`` command line."""
    parser = subparsers.add_parser(
        "timeline",
        help="draw the job as a self-contained HTML timeline (needs the 'trace' extra)",
        description="Write a self-contained HTML page (plotly, opens offline) with one lane "
        "per incarnation and rank: queue, startup phases, intervals, checkpoints, "
        "evaluations, restart gaps and how each incarnation ended.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="traces.jsonl files")
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("timeline.html"), help="the page to write"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``timeline`` for parsed arguments; returns the exit status."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        print(PLOTLY_MISSING, file=sys.stderr)
        return 2
    try:
        timeline = collect(span_source(args.files), [str(path) for path in args.files])
    except TraceInputError as exc:
        print(f"megatron-trace timeline: error: {exc}", file=sys.stderr)
        return 2
    write_page(timeline, args.output)
    print(f"timeline written to {args.output}")
    return 0


def write_beside_trace(args: argparse.Namespace) -> Path | None:
    """The end of ``tox -e demo``: draw the run's trace as ``timeline.html`` beside it.

    Best effort by design: whatever goes wrong (telemetry off, plotly not
    installed, an unreadable file) is one line on stdout, never an exception,
    so it cannot change how the training run ends. Returns the page's path.
    """
    try:
        from megatron.core.telemetry.config import TelemetryConfig

        if os.environ.get("RANK", "0") != "0":
            return None  # one page per job, from the first rank's launcher
        config = TelemetryConfig.from_args(args)
        trace = config.trace_file
        if not config.enabled or config.exporter != "jsonl" or trace is None or not trace.is_file():
            return None
        try:
            import plotly  # noqa: F401
        except ImportError:
            print("timeline: not drawn; pip install 'megatron-telemetry-spans[trace]'", flush=True)
            return None
        output = trace.with_name("timeline.html")
        write_page(collect(span_source([trace]), [str(trace)]), output)
    except Exception as exc:  # noqa: BLE001 -- a picture must never end a training run
        print(f"timeline: not drawn: {exc}", flush=True)
        return None
    print(f"timeline: {output}", flush=True)
    return output


def write_page(timeline: Timeline, output: Path) -> None:
    """Write the page beside ``output`` and rename it over, so a failure leaves no torn page."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        tmp.write_text(render_html(timeline), encoding="utf-8")
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def collect(source: SpanSource, files: list[str] | None = None) -> Timeline:
    """Read the spans in one pass into the trace model, then into bars and lane summaries.

    The model (shared with ``check`` and ``report``) decides incarnations and
    how each ended; the startup phases, which it does not keep, are kept here
    (a handful per incarnation).
    """
    builder = TraceBuilder()
    phases = []
    for span in source():
        builder.add(span)
        if _category(span["name"]) == "startup_phase":
            phases.append(span)
    index = LaneIndex(builder.finish())
    trace = index.trace
    bars: list[Bar] = []
    summaries = []
    waste = {}  # the report's own accounting, per incarnation, with "resumed" added
    for incs in trace.ranks.values():
        per_incarnation = rank_accounting(incs)["per_incarnation"]
        for position, (inc, entry) in enumerate(zip(incs, per_incarnation, strict=True)):
            waste[id(inc)] = {**entry, "resumed": position + 1 < len(incs)}
    for inc in trace.incarnations:
        lane = index.lane_of_incarnation(inc)
        records = [*inc.pre_startup, *([inc.startup] if inc.startup else []), *inc.launch,
                   *inc.intervals, *inc.loads, *inc.saves, *inc.evaluations]  # fmt: skip
        for record in records:
            bars.append(_bar(lane, _category(record.name) or "other", _as_span(record)))
        if waste[id(inc)]["wasted_window_ns"] > 0:
            bars.append(_wasted_bar(lane, inc, waste[id(inc)]))
        summaries.append(
            LaneSummary(lane, inc.start_ns, inc.end_ns, inc.ended, [r.name for r in inc.cut_short])
        )
    for span in phases:
        bars.append(_bar(index.lane(span), "startup_phase", span))
    lanes = sorted(summaries, key=lambda s: (s.lane.incarnation, index.ranks.index(s.lane.rank)))
    bars.extend(_restart_gaps(lanes))
    report = build_report(trace) if trace.ranks else None
    return Timeline(bars, lanes, index.several_ranks, trace.span_count, list(files or []), report)


def _as_span(record: SpanRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "trace_id": record.trace_id,
        "span_id": record.span_id,
        "start_ns": record.start_ns,
        "end_ns": record.end_ns,
        "attributes": record.attributes,
    }


def _category(name: str) -> str | None:
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name in _LAUNCH:
        return "launch"
    if name.startswith("megatron.startup."):
        return "startup_phase"
    return None


def _bar(lane: Lane, category: str, span: dict[str, Any]) -> Bar:
    attributes = span["attributes"]
    text = ""
    details = []
    if category == "interval":
        index = attributes.get("megatron.interval.index")
        first = attributes.get("megatron.interval.first_iteration")
        last = attributes.get("megatron.interval.last_iteration")
        text = f"C{index} · {first}–{last}" if index is not None else ""
        if first is not None:
            details.append(f"iterations {first}–{last}")
    elif category == "startup_phase" or category == "launch":
        text = span["name"].removeprefix("megatron.startup.")
    elif "megatron.iteration" in attributes:
        details.append(f"at iteration {attributes['megatron.iteration']}")
    if span.get("status_code") == "ERROR":
        details.append(f"status ERROR {span.get('status_message', '')}".rstrip())
    for key, value in list(attributes.items())[:_MAX_ATTRIBUTES]:
        details.append(f"{key} = {value}")
    details.append(f"trace {span['trace_id'][:8]}… span {span['span_id']}")
    return Bar(lane, category, span["name"], span["start_ns"], span["end_ns"], text, details)


def _wasted_bar(lane: Lane, inc: Incarnation, waste: dict[str, Any]) -> Bar:
    """The incarnation's wasted progress, exactly as ``report`` counts it.

    From the first iteration past the last progress that survived (the
    iteration the next incarnation resumed from, or the last save of a final
    incarnation that did not shut down) to the incarnation's last span.
    """
    horizon, count = waste["horizon"], waste["wasted_iterations"]
    last = inc.last_iteration
    numbers = f"{horizon}–{last}" if last is not None and last >= horizon else f"{horizon}–"
    details = [f"{count} iterations ({numbers}) whose results were lost"]
    if inc.ended == "killed":
        details.append("killed: its interval in flight was never written (SIGKILL)")
    if waste["resumed"]:
        details.append(f"incarnation {inc.index + 1} resumed from iteration {horizon}")
    else:
        details.append(f"no later incarnation; the last checkpoint was at iteration {horizon}")
    text = f"wasted · {numbers}"
    return Bar(
        lane,
        "wasted",
        "wasted progress",
        inc.end_ns - waste["wasted_window_ns"],
        inc.end_ns,
        text,
        details,
    )


def _restart_gaps(lanes: list[LaneSummary]) -> Iterable[Bar]:
    """Between each rank's incarnation k and k+1: from the last span end to the next start."""
    previous: dict[int, LaneSummary] = {}
    for summary in lanes:
        before = previous.get(summary.lane.rank)
        previous[summary.lane.rank] = summary
        if before is not None and summary.start_ns > before.end_ns:
            yield Bar(
                summary.lane,
                "restart_gap",
                "restart gap",
                before.end_ns,
                summary.start_ns,
                "gap",
                [
                    f"from the last span of incarnation {before.lane.incarnation} "
                    f"({_ENDED_TEXT.get(before.ended, before.ended)}) "
                    f"to the first of incarnation {summary.lane.incarnation}"
                ],
            )


# ---------------------------------------------------------------------------------------------
# Rendering


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _duration(ns: int) -> str:
    seconds = ns / 1e9
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def _hover(bar: Bar, label: str) -> str:
    lines = [
        f"<b>{html.escape(bar.name)}</b>",
        f"{html.escape(label)}",
        f"duration {_duration(bar.end_ns - bar.start_ns)}",
        f"{_when(bar.start_ns)[11:23]} → {_when(bar.end_ns)[11:23]} UTC",
        *(html.escape(detail) for detail in bar.details),
    ]
    return "<br>".join(lines)


_ENDED_COLOURS = {"shutdown": "#31a354", "cut_short": "#e6550d", "killed": "#d62728"}
_ENDED_TEXT = {"shutdown": "shut down", "cut_short": "cut short", "killed": "killed"}


def _lane_label(summary: LaneSummary, several_ranks: bool) -> str:
    colour = _ENDED_COLOURS.get(summary.ended, "#444")
    ended = _ENDED_TEXT.get(summary.ended, summary.ended)
    return (
        f"<b>{summary.lane.label(several_ranks)}</b><br><span style='color:{colour}'>{ended}</span>"
    )


def figure(timeline: Timeline) -> Any:
    """The plotly figure: horizontal bars on a wall-clock axis, one numeric row per lane."""
    import plotly.graph_objects as go

    rows = {summary.lane: position for position, summary in enumerate(timeline.lanes)}
    labels = {
        summary.lane: summary.lane.label(timeline.several_ranks) for summary in timeline.lanes
    }
    fig = go.Figure()
    for key, legend, colour in CATEGORIES:
        bars = [bar for bar in timeline.bars if bar.category == key]
        if not bars:
            continue
        nested = key in _NESTED
        fig.add_trace(
            go.Bar(
                name=legend,
                legendgroup=key,
                orientation="h",
                y=[rows[bar.lane] for bar in bars],
                base=[_when(bar.start_ns) for bar in bars],
                x=[max(bar.end_ns - bar.start_ns, 0) / 1e6 for bar in bars],
                width=0.3 if nested else (0.45 if key == "startup" else 0.6),
                marker=_marker(key, colour),
                # Wasted progress lies over the interval that did the work: hatch, no label.
                text=[bar.text for bar in bars] if key != "wasted" else None,
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                hovertext=[_hover(bar, labels[bar.lane]) for bar in bars],
                hoverinfo="text",
            )
        )
        if nested:
            # Saves, loads and evaluations take milliseconds in a run of minutes: a marker
            # at each keeps them visible (and hoverable) at any zoom.
            fig.add_trace(
                go.Scatter(
                    name=legend,
                    legendgroup=key,
                    showlegend=False,
                    mode="markers",
                    y=[rows[bar.lane] + _MARKER_OFFSET[key] for bar in bars],
                    x=[_when((bar.start_ns + bar.end_ns) // 2) for bar in bars],
                    marker={
                        "color": colour,
                        "size": 11,
                        "symbol": "triangle-down" if _MARKER_OFFSET[key] < 0 else "triangle-up",
                        "line": {"color": "#333", "width": 1},
                    },
                    hovertext=[_hover(bar, labels[bar.lane]) for bar in bars],
                    hoverinfo="text",
                )
            )
    _add_endings(fig, timeline, rows)
    height = 230 + 90 * max(len(timeline.lanes), 1)
    fig.update_layout(
        barmode="overlay",
        height=height,
        margin={"l": 10, "r": 20, "t": 30, "b": 110},
        legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0, "x": 0},
        uniformtext={"minsize": 9, "mode": "hide"},
        plot_bgcolor="white",
        hoverlabel={"align": "left"},
        font={"family": "Helvetica, Arial, sans-serif", "size": 13},
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(rows.values()),
        ticktext=[_lane_label(s, timeline.several_ranks) for s in timeline.lanes],
        autorange="reversed",
        showgrid=False,
        zeroline=False,
    )
    fig.update_xaxes(
        type="date",
        showgrid=True,
        gridcolor="#eee",
    )
    return fig


def _marker(key: str, colour: str) -> dict[str, Any]:
    if key == "wasted":  # translucent red hatch, so the interval underneath still shows
        return {
            "color": "rgba(214, 39, 40, 0.25)",
            "line": {"color": colour, "width": 1.5},
            "pattern": {"shape": "x", "fgcolor": colour, "size": 8, "solidity": 0.15},
        }
    return {
        "color": colour,
        "line": {"color": "white", "width": 1},
        "pattern": {"shape": _PATTERNED.get(key, ""), "fgcolor": "white"},
    }


def _add_endings(fig: Any, timeline: Timeline, rows: dict[Lane, int]) -> None:
    """A mark where each incarnation stopped that was not a clean shutdown."""
    import plotly.graph_objects as go

    for ended, symbol, colour in (("cut_short", "x", "#e6550d"), ("killed", "x", "#d62728")):
        lanes = [s for s in timeline.lanes if s.ended == ended]
        if not lanes:
            continue
        hover = []
        for summary in lanes:
            lines = [
                f"<b>{_ENDED_TEXT[ended]}</b>",
                html.escape(summary.lane.label(timeline.several_ranks)),
            ]
            if ended == "killed":
                lines.append("its interval in flight was never written (SIGKILL)")
            else:
                lines.append("spans still open at shutdown (SIGTERM or an exception):")
            lines += [f"{html.escape(name)}" for name in summary.cut_short[:8]]
            hover.append("<br>".join(lines))
        fig.add_trace(
            go.Scatter(
                name=f"ended: {_ENDED_TEXT[ended]}",
                mode="markers",
                y=[rows[s.lane] for s in lanes],
                x=[_when(s.end_ns) for s in lanes],
                marker={"symbol": symbol, "size": 16, "color": colour, "line": {"width": 2}},
                hovertext=hover,
                hoverinfo="text",
            )
        )


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 16px 24px; color: #222; }}
h1 {{ font-size: 20px; margin: 0 0 4px 0; }}
.files {{ color: #666; font-size: 13px; margin-bottom: 10px; }}
.summary {{ display: flex; flex-wrap: wrap; gap: 8px 28px; font-size: 14px; margin: 8px 0; }}
.summary b {{ font-size: 16px; }}
.note {{ color: #666; font-size: 12px; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head>
<body>
<h1>{title}</h1>
<div class="files">{files}</div>
<div class="summary">{summary}</div>
{goodput}
{plot}
<p class="note">Time runs left to right in wall-clock UTC. Hover a bar for its span,
duration, iterations and attributes; drag to zoom, double-click to reset. Triangles mark
checkpoint loads, saves and evaluations, which are too short to see at full scale. Lanes are
incarnations (one per launch of the job){ranks}.</p>
</body>
</html>
"""


def render_html(timeline: Timeline) -> str:
    """The whole page, plotly.js embedded (about 4.5 MB), so it opens without a network."""
    plot = figure(timeline).to_html(
        full_html=False, include_plotlyjs=False, div_id="timeline", config={"displaylogo": False}
    )
    ended = ", ".join(
        f"{s.lane.label(timeline.several_ranks)}: {_ENDED_TEXT.get(s.ended, s.ended)}"
        for s in timeline.lanes
    )
    summary = [
        f"<span>incarnations <b>{len({s.lane.incarnation for s in timeline.lanes})}</b></span>",
        f"<span>spans <b>{timeline.spans}</b></span>",
        f"<span>{html.escape(ended)}</span>",
    ]
    goodput = ""
    if timeline.report is not None:
        bar = summary_figure(timeline.report).to_html(
            full_html=False, include_plotlyjs=False, div_id="goodput",
            config={"displayModeBar": False},
        )  # fmt: skip
        goodput = summary_html(timeline.report) + bar
    from plotly.offline import get_plotlyjs

    return _PAGE.format(
        plotlyjs=get_plotlyjs(),
        title="megatron-trace timeline",
        files=html.escape(" ".join(timeline.files)),
        summary="\n".join(summary),
        goodput=goodput,
        plot=plot,
        ranks=" and ranks" if timeline.several_ranks else "",
    )
