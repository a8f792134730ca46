"""How the timeline looks: the plotly Gantt figure and the self-contained page around it.

Horizontal bars on a wall-clock axis, one row per lane, one trace per
category (so the legend is the colour key), saves, loads and evaluations
pinned with triangles since they last milliseconds, and a mark where an
incarnation did not shut down cleanly; in a strip above the lanes, on the same time
axis, the goodput of each window of the wall clock (``report --window``'s accounting, a
step per window). The page embeds plotly.js once, in
its head, so it opens offline; the goodput summary
(:mod:`megatron.trace.render.timeline.summary`) sits above the lanes. The bars'
arrays are streamed into the page through temporary columns
(:mod:`megatron.trace._store.json_columns`), so a week of intervals takes no more
memory than a day.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from megatron.trace._store.json_columns import JsonColumns, script_safe
from megatron.trace.render.lanes import Lane, incarnation_name
from megatron.trace.render.timeline.data import (
    BAR_IN_FLIGHT,
    BAR_INTERVAL,
    BAR_STARTUP_PHASE,
    BAR_WASTED,
    ENDED_TEXT,
    Bar,
    GoodputWindow,
    LaneSummary,
    Timeline,
)
from megatron.trace.render.timeline.ranks import ranks_figure
from megatron.trace.render.timeline.summary import (
    CATEGORY_COLOURS,
    duration_text,
    summary_figure,
    summary_html,
)
from megatron.trace_format.semconv import (
    GRAD_SYNC_FINISH_SPAN,
    Category,
)
from megatron.trace_format.words import counted

__all__ = [
    "CATEGORIES",
    "Piece",
    "axis_time",
    "endings_text",
    "figure",
    "files_text",
    "lane_layout",
    "lane_name",
    "lanes_plot",
    "page_pieces",
    "piece_bytes",
    "plot_div",
    "rank_list",
    "render_html",
]

# Categories, in legend and drawing order: (key, legend label, colour).
# Later ones are drawn on top, so nested spans stay visible over their parents.
_C = CATEGORY_COLOURS  # one colour per category, shared with the goodput bar
CATEGORIES = (
    (Category.QUEUE, "scheduler queue", _C[Category.QUEUE]),
    (Category.RESTART_GAP, "restart gap", _C[Category.RESTART_GAP]),
    (Category.STARTUP, "startup, between phases", "#c6dbef"),
    (Category.LAUNCH, "launch, container", _C[Category.LAUNCH]),
    (BAR_STARTUP_PHASE, "startup phase", _C[Category.STARTUP]),
    (BAR_INTERVAL, "training interval", _C[Category.GOODPUT]),
    (BAR_IN_FLIGHT, "in flight (running; not in the file yet)", _C[Category.GOODPUT]),
    (BAR_WASTED, "wasted progress", _C[Category.WASTED_PROGRESS]),
    (Category.HANG, "hang (no progress)", _C[Category.HANG]),
    (Category.CHECKPOINT_LOAD, "checkpoint load", _C[Category.CHECKPOINT_LOAD]),
    (Category.CHECKPOINT_SAVE, "checkpoint save", _C[Category.CHECKPOINT_SAVE]),
    (Category.EVALUATION, "evaluation", _C[Category.EVALUATION]),
)
_NESTED = {Category.CHECKPOINT_LOAD, Category.CHECKPOINT_SAVE, Category.EVALUATION}
# Markers above the lane (checkpoints) and below it (evaluations): the two often
# happen in the same millisecond, so they must not share a spot. Rows grow downwards.
_MARKER_OFFSET = {
    Category.CHECKPOINT_LOAD: -0.38,
    Category.CHECKPOINT_SAVE: -0.38,
    Category.EVALUATION: 0.38,
}
_PATTERNED = {Category.RESTART_GAP: "/", BAR_IN_FLIGHT: "."}


def axis_time(ns: int) -> str:
    """An instant (ns since the epoch) as the figures' time axes take it: UTC, to the µs."""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _duration(ns: int) -> str:
    return duration_text(ns / 1e9)


def _hover(bar: Bar, label: str) -> str:
    lines = [
        f"<b>{html.escape(bar.name)}</b>",
        f"{html.escape(label)}",
        f"duration {_duration(bar.end_ns - bar.start_ns)}",
        f"{axis_time(bar.start_ns)[11:23]} → {axis_time(bar.end_ns)[11:23]} UTC",
        *(html.escape(detail) for detail in bar.details),
    ]
    return "<br>".join(lines)


_ENDED_COLOURS = {
    "shutdown": "#31a354",
    "cut_short": "#e6550d",
    "killed": "#d62728",
    "running": "#3182bd",
    "failed": "#d62728",
    "interrupted": "#e6550d",
    "restarted": "#9467bd",
}


def rank_list(ranks: Sequence[str]) -> str:
    """Ranks as a reader scans them: runs of numbers as ranges (``0–4, 6–63``)."""
    if not all(rank.isdigit() for rank in ranks):
        return ", ".join(ranks)
    numbers = sorted(int(rank) for rank in ranks)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def lane_name(summary: LaneSummary, several_ranks: bool) -> str:
    """The lane's name: its incarnation and rank, or every rank it stands for."""
    if not summary.alike:
        return summary.lane.label(several_ranks)
    ranks = [summary.lane.rank, *summary.alike]
    name = incarnation_name(summary.lane.incarnation, summary.lane.cycle)
    return f"{name} · ranks {rank_list(ranks)} ({len(ranks)} alike)"


def _lane_label(summary: LaneSummary, several_ranks: bool, one_line: bool = False) -> str:
    colour = _ENDED_COLOURS.get(summary.ended, "#444")
    ended = ENDED_TEXT.get(summary.ended, summary.ended)
    if summary.as_of_ns is not None:
        ended += f" · as of {axis_time(summary.as_of_ns)[11:19]} UTC"
    name = html.escape(lane_name(summary, several_ranks))
    gap = " · " if one_line else "<br>"
    return f"<b>{name}</b>{gap}<span style='color:{colour}'>{ended}</span>"


#: The lanes' share of the page: each lane LANE_PX high while they fit in LANES_PX, then
#: thinner, down to MIN_LANE_PX; more lanes than that scroll (drag the lane axis).
LANE_PX = 90
MIN_LANE_PX = 30
LANES_PX = 1350
#: Below this height a lane's label is one line (its name, then how it ended).
_TWO_LINE_PX = 60


def lane_layout(lanes: int) -> tuple[int, int]:
    """(pixels per lane, lanes in view) for ``lanes`` lanes: the page's height is bounded."""
    lanes = max(lanes, 1)
    px = max(MIN_LANE_PX, min(LANE_PX, LANES_PX // lanes))
    return px, min(lanes, LANES_PX // px)


def figure(timeline: Timeline) -> Any:
    """The plotly figure: horizontal bars on a wall-clock axis, one numeric row per lane.

    Every bar's values in the figure, in memory: the page streams them instead
    (:func:`page_pieces`); this is the same figure as one plotly object, for
    whoever wants it (and for the page when plotly's markup is not as expected)."""
    values: dict[str, dict[str, list[Any]]] = {}
    for key, field, value in _bar_values(timeline):
        values.setdefault(key, {}).setdefault(field, []).append(value)
    return _figure(timeline, values)


def _bar_values(timeline: Timeline) -> Iterator[tuple[str, str, Any]]:
    """(category, field, value) of every bar in turn: the figure's arrays, one value at
    a time. Fields are the traces' own (``y``, ``base``, ``x``, ``text``, ``hovertext``)
    and, for nested categories, their markers' (``marker_y``, ``marker_x``)."""
    rows = _rows(timeline)
    labels = {
        summary.lane: lane_name(summary, timeline.several_ranks) for summary in timeline.lanes
    }
    for bar in timeline.bars:
        if bar.lane not in rows:  # a rank drawn by an alike rank's lane
            continue
        key, row = bar.category, rows[bar.lane]
        yield key, "y", row
        yield key, "base", axis_time(bar.start_ns)
        yield key, "x", max(bar.end_ns - bar.start_ns, 0) / 1e6
        if key != BAR_WASTED:  # wasted progress lies over the interval that did the work
            yield key, "text", bar.text
        yield key, "hovertext", _hover(bar, labels[bar.lane])
        if key in _NESTED:
            yield key, "marker_y", row + _MARKER_OFFSET[key]
            yield key, "marker_x", axis_time((bar.start_ns + bar.end_ns) // 2)


def _rows(timeline: Timeline) -> dict[Lane, int]:
    return {summary.lane: position for position, summary in enumerate(timeline.lanes)}


def _figure(timeline: Timeline, values: Mapping[str, Mapping[str, Sequence[Any]]]) -> Any:
    """The figure of ``values`` (category -> field -> array, as :func:`_bar_values` makes
    them; a category without values draws no trace)."""
    import plotly.graph_objects as go

    rows = _rows(timeline)
    fig = go.Figure()
    for key, legend, colour in CATEGORIES:
        columns = values.get(key)
        if not columns:
            continue
        nested = key in _NESTED
        fig.add_trace(
            go.Bar(
                name=legend,
                legendgroup=key,
                orientation="h",
                y=columns["y"],
                base=columns["base"],
                x=columns["x"],
                width=0.3 if nested else (0.45 if key == Category.STARTUP else 0.6),
                marker=_marker(key, colour),
                # Wasted progress is hatched, without a label.
                text=columns.get("text"),
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                hovertext=columns["hovertext"],
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
                    y=columns["marker_y"],
                    x=columns["marker_x"],
                    marker={
                        "color": colour,
                        "size": 11,
                        "symbol": "triangle-down" if _MARKER_OFFSET[key] < 0 else "triangle-up",
                        "line": {"color": "#333", "width": 1},
                    },
                    hovertext=columns["hovertext"],
                    hoverinfo="text",
                )
            )
    _add_endings(fig, timeline, rows)
    lane_px, in_view = lane_layout(len(timeline.lanes))
    height = 230 + lane_px * in_view
    if timeline.windows:
        height += _STRIP_PX
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
        ticktext=[
            _lane_label(s, timeline.several_ranks, lane_px < _TWO_LINE_PX) for s in timeline.lanes
        ],
        # the lanes in view, first at the top (an explicit range: autorange pads bars' axes)
        range=[in_view - 0.5, -0.5],
        autorange=False,
        showgrid=False,
        zeroline=False,
    )
    fig.update_xaxes(
        type="date",
        showgrid=True,
        gridcolor="#eee",
    )
    if timeline.windows:  # after the lanes' axis settings, which apply to every y axis
        _add_goodput_line(fig, timeline.windows, height)
    return fig


#: The goodput strip's height above the lanes, in pixels, and the gap below it.
_STRIP_PX = 120
_STRIP_GAP_PX = 22
_LINE_COLOUR = "#238b45"


def _add_goodput_line(fig: Any, windows: list[GoodputWindow], height: int) -> None:
    """The goodput of each window, a step from its start to its end, in a strip above the
    lanes (its own y axis, 0-100 %, on the lanes' time axis); hovering a step gives the
    window's goodput and its largest badput."""
    import plotly.graph_objects as go

    width = windows[0].end_ns - windows[0].start_ns
    hover = [_window_hover(window) for window in windows]
    fig.add_trace(
        go.Scatter(
            name=f"goodput per {_duration(width)} window (top strip)",
            mode="lines+markers",
            line={"shape": "hv", "color": _LINE_COLOUR, "width": 2},
            marker={"size": 4, "color": _LINE_COLOUR},
            fill="tozeroy",
            fillcolor="rgba(35, 139, 69, 0.12)",
            # A point at each window's start, and one more where the last ends.
            x=[axis_time(w.start_ns) for w in windows] + [axis_time(windows[-1].end_ns)],
            y=[_percent(w) for w in windows] + [_percent(windows[-1])],
            hovertext=hover + hover[-1:],
            hoverinfo="text",
            yaxis="y2",
        )
    )
    plot_px = height - 30 - 110  # the layout's margins
    top = 1 - _STRIP_PX / plot_px
    fig.update_layout(
        yaxis={"domain": [0, max(top - _STRIP_GAP_PX / plot_px, 0.05)]},
        yaxis2={
            "domain": [top, 1],
            "anchor": "x",
            "range": [0, 105],
            "autorange": False,
            "tickmode": "array",
            "tickvals": [0, 50, 100],
            "ticktext": ["0 %", "50 %", "100 %"],
            "title": {"text": "goodput", "font": {"size": 12}},
            "showgrid": True,
            "gridcolor": "#eee",
            "zeroline": False,
        },
    )


def _percent(window: GoodputWindow) -> float:
    return round(100 * window.entry["goodput_fraction"], 4)


def _window_hover(window: GoodputWindow) -> str:
    entry = window.entry
    lines = [
        f"<b>goodput {100 * entry['goodput_fraction']:.1f} %</b>",
        f"window {axis_time(window.start_ns)[11:19]} → {axis_time(window.end_ns)[11:19]} UTC"
        f" ({_duration(window.end_ns - window.start_ns)})",
    ]
    for category in entry["top_badput"]:
        seconds = entry["accounting_ns"][category] / 1e9
        lines.append(f"{category.replace('_', ' ')} {duration_text(seconds)}")
    if entry.get("iterations"):
        lines.append(
            f"{counted(entry['iterations'], 'iteration')}, mean {entry['iteration_mean_ms']} ms"
        )
    return "<br>".join(lines)


def _marker(key: str, colour: str) -> dict[str, Any]:
    if key == BAR_WASTED:  # translucent red hatch, so the interval underneath still shows
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

    endings = (
        ("cut_short", "x", "#e6550d"),
        ("killed", "x", "#d62728"),
        ("failed", "x", _ENDED_COLOURS["failed"]),
        ("interrupted", "x", _ENDED_COLOURS["interrupted"]),
        ("restarted", "circle-x", _ENDED_COLOURS["restarted"]),
        ("running", "triangle-right", _ENDED_COLOURS["running"]),
    )
    for ended, symbol, colour in endings:
        lanes = [s for s in timeline.lanes if s.ended == ended]
        if not lanes:
            continue
        hover = []
        for summary in lanes:
            lines = [
                f"<b>{ENDED_TEXT[ended]}</b>",
                html.escape(lane_name(summary, timeline.several_ranks)),
            ]
            if ended == "killed":
                lines.append("its interval in flight was never written (SIGKILL)")
            elif ended == "running":
                assert summary.as_of_ns is not None
                lines.append(f"still running as of {axis_time(summary.as_of_ns)[:19]} UTC,")
                lines.append("its newest record: the figures stop there")
            elif ended == "failed":
                lines.append("an uncaught exception ended it")
            elif ended == "interrupted":
                lines.append("a Ctrl-C (SIGINT) ended it")
            elif ended == "restarted":
                lines.append("a fault ended this cycle, and NVRx called pretrain() again")
                lines.append("in the same process (an in-process restart)")
            else:
                lines.append("spans still open at shutdown (SIGTERM or SIGHUP):")
            lines += [f"{html.escape(name)}" for name in summary.cut_short[:8]]
            hover.append("<br>".join(lines))
        fig.add_trace(
            go.Scatter(
                name=f"ended: {ENDED_TEXT[ended]}",
                mode="markers",
                y=[rows[s.lane] for s in lanes],
                x=[axis_time(s.end_ns) for s in lanes],
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
incarnations (one per launch of the job, or per cycle of an in-process
restart){ranks}.{lanes_note}</p>
{iterations}
</body>
</html>
"""


#: What stands for the traces in the markup plotly writes around them (see plot_div),
#: and for the timeline's plot in the page (escaped text holds no "<").
_DATA_MARK = "megatron-trace: the traces go here"
_PLOT_MARK = "<!-- megatron-trace: the timeline goes here -->"
#: What stands for a column of the lanes' bars in their figure (see lanes_plot).
_COLUMN_MARK = "megatron-trace: column "
_COLUMN = re.compile(rb'\["' + re.escape(_COLUMN_MARK.encode()) + rb'([^"]+)"\]')

#: A piece of the page: text, UTF-8 bytes, or bytes still to be read (a spilled column);
#: :func:`piece_bytes` turns pieces into the page's bytes.
Piece = str | bytes | Iterator[bytes]


def _traces_json(fig_data: Any) -> bytes | None:
    """The figure's traces as script-safe JSON by msgspec (None: no msgspec, or a value
    it cannot encode)."""
    try:
        import msgspec

        return script_safe(msgspec.json.encode(fig_data))
    except (ImportError, TypeError):
        return None


def _markup(
    layout: dict[str, Any], div_id: str, config: dict[str, Any], data: bytes
) -> list[Piece] | None:
    """plotly's markup of a figure with ``layout`` (the layout, the config, the div)
    around ``data`` in place of the traces' JSON: None if plotly's markup no longer
    holds them as expected."""
    import plotly.io as pio

    options = {"full_html": False, "include_plotlyjs": False, "div_id": div_id, "config": config}
    stand_in = {"data": [_DATA_MARK], "layout": layout}
    before, mark, after = pio.to_html(stand_in, validate=False, **options).partition(
        f'["{_DATA_MARK}"]'
    )
    return [before, data, after] if mark else None


def plot_div(fig: Any, div_id: str, config: dict[str, Any]) -> list[Piece]:
    """``fig.to_html(full_html=False, include_plotlyjs=False, div_id=..., config=...)``
    in pieces, the traces' JSON (the bulk) as UTF-8 bytes encoded by msgspec.

    plotly's JSON encoder encodes the figure, parses the text back and encodes it
    again (to write NaN as null), and the page it is put in is one string. So
    plotly writes the markup, the layout and the config around a stand-in for the
    traces, and msgspec the traces themselves, escaped as plotly escapes them; they
    stay bytes until they are written. Without msgspec, or for a value it cannot
    encode, it is plotly's own markup; its tests (``timeline/test_write.py``) hold the two to the
    same figure.
    """
    figure_json = fig.to_plotly_json()
    data = _traces_json(figure_json["data"])
    pieces = None if data is None else _markup(figure_json["layout"], div_id, config, data)
    if pieces is None:
        return [fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=config)]
    return pieces


def lanes_plot(timeline: Timeline, div_id: str, config: dict[str, Any]) -> list[Piece]:
    """The lanes' plot as :func:`plot_div` writes :func:`figure`, its bars' arrays
    streamed: written to :class:`JsonColumns` in one pass over the bars, and read
    back into the page as it is written.

    The figure plotly sees holds a stand-in for each array (a one-string array
    naming the column), so the markup, layout and traces' settings are plotly's
    own; the traces' JSON is split at the stand-ins and each column's array goes
    in its place. Memory is a chunk per column, not a few kilobytes per bar
    (``tests/trace/render/timeline/test_write.py`` holds the page to plotly's ``to_html`` of
    :func:`figure`).
    """
    columns = JsonColumns()
    for key, field, value in _bar_values(timeline):
        columns.append(f"{key}.{field}", value)
    stand_ins = {
        key: {
            field: [f"{_COLUMN_MARK}{key}.{field}"]
            for field in _FIELDS
            if columns.count(f"{key}.{field}")
        }
        for key, _, _ in CATEGORIES
    }
    skeleton = _figure(timeline, stand_ins).to_plotly_json()
    traces = skeleton["data"]
    data = _traces_json(traces)
    if data is None:  # no msgspec: plotly's JSON of the skeleton (a few kilobytes)
        import plotly.io as pio

        data = pio.json.to_json_plotly(traces).encode()
    plot = _markup(skeleton["layout"], div_id, config, b"")
    if plot is None:  # plotly's markup changed: its own, of the whole figure
        return plot_div(figure(timeline), div_id, config)
    before, _, after = plot
    parts = _COLUMN.split(data)  # text, column, text, column, ..., text
    spliced: list[Piece] = [before]
    for position, part in enumerate(parts):
        spliced.append(columns.array(part.decode()) if position % 2 else part)
    return [*spliced, after]


# The fields of _bar_values, each a column of the streamed page.
_FIELDS = ("y", "base", "x", "text", "hovertext", "marker_y", "marker_x")


def _text(pieces: Iterable[Piece]) -> str:
    return b"".join(piece_bytes(pieces)).decode()


def piece_bytes(pieces: Iterable[Piece]) -> Iterator[bytes]:
    """The pieces as UTF-8 bytes, in order (a spilled column read as it goes)."""
    for piece in pieces:
        if isinstance(piece, str):
            yield piece.encode()
        elif isinstance(piece, bytes):
            yield piece
        else:
            yield from piece


def page_pieces(timeline: Timeline) -> Iterator[bytes]:
    """The whole page in order, as UTF-8 bytes, as :func:`write_page` writes it:
    plotly.js embedded (about 4.5 MB), so it opens without a network.

    Everything but the bars' arrays is worked out before this returns (the bars
    are gone through once, into temporary columns); those are read as the
    pieces are."""
    plot = lanes_plot(timeline, "timeline", {"displaylogo": False})
    summary = [
        f"<span>incarnations <b>{len({s.lane.incarnation for s in timeline.lanes})}</b></span>",
        *([f"<span>ranks <b>{timeline.ranks}</b></span>"] if timeline.several_ranks else []),
        f"<span>spans <b>{timeline.spans}</b></span>",
        f"<span>{endings_text(timeline)}</span>",
    ]
    goodput = ""
    if timeline.report is not None:
        bar = plot_div(summary_figure(timeline.report), "goodput", {"displayModeBar": False})
        goodput = summary_html(timeline.report) + _text(bar)
    iterations = ""
    if timeline.series:
        iterations = _text(
            plot_div(
                ranks_figure(timeline.series, timeline.report), "iterations", {"displaylogo": False}
            )
        )
        if any(one.work_ms for one in timeline.series):
            iterations += (
                "<p class='note'>Solid: a rank's own work per iteration (the iteration minus its "
                f"gradient all-reduce wait, {GRAD_SYNC_FINISH_SPAN}); dotted: the whole "
                "iteration. A rank whose work line sits high is the one the others wait for.</p>"
            )
        else:  # no work line to explain: say what would draw one
            iterations += (
                "<p class='note'>Dotted: each rank's whole iteration. Its own work (the iteration "
                f"minus its gradient all-reduce wait) needs the {GRAD_SYNC_FINISH_SPAN} spans of "
                "the communication span group, on a job of several ranks.</p>"
            )
    from plotly.offline import get_plotlyjs

    head, _, tail = _PAGE.format(
        plotlyjs=get_plotlyjs(),
        title="megatron-trace timeline",
        files=html.escape(files_text(timeline.files)),
        summary="\n".join(summary),
        goodput=goodput,
        plot=_PLOT_MARK,
        ranks=" and ranks" if timeline.several_ranks else "",
        lanes_note=_lanes_note(timeline),
        iterations=iterations,
    ).partition(_PLOT_MARK)
    return piece_bytes([head, *plot, tail])


#: With more files than this the header names the first and the last few, and counts them.
_NAMED_FILES = 6


def files_text(files: Sequence[str]) -> str:
    """The files read, as the header gives them: every one, or for many the first and last
    three and how many there are."""
    if len(files) <= _NAMED_FILES:
        return " ".join(files)
    half = _NAMED_FILES // 2
    return f"{len(files)} files: {' '.join(files[:half])} … {' '.join(files[-half:])}"


def _lanes_note(timeline: Timeline) -> str:
    notes = []
    if any(s.alike for s in timeline.lanes):
        notes.append(
            " Ranks whose lanes would look the same (every time within a thousandth of the "
            "wall clock) share one lane, which names them."
        )
    in_view = lane_layout(len(timeline.lanes))[1]
    if in_view < len(timeline.lanes):
        notes.append(
            f" {in_view} of the {len(timeline.lanes)} lanes are in view: drag the lane "
            "names up or down to scroll."
        )
    return "".join(notes)


#: How many lanes of an unusual ending the header names before it only counts them.
_NAMED_ENDINGS = 4


def endings_text(timeline: Timeline) -> str:
    """The header's line on how the lanes ended: a count per ending, and the lanes of each
    ending other than a clean shutdown named (the first few), never one entry per lane."""
    lanes = timeline.all_lanes or timeline.lanes
    by_ending: dict[str, list[LaneSummary]] = {}
    for summary in lanes:
        by_ending.setdefault(summary.ended, []).append(summary)
    parts = []
    for ended, found in sorted(by_ending.items(), key=lambda item: item[0] != "shutdown"):
        text = f"{len(found)} {ENDED_TEXT.get(ended, ended)}"
        if ended != "shutdown" or len(lanes) <= _NAMED_ENDINGS:
            names = [_ended_name(s, timeline.several_ranks) for s in found[:_NAMED_ENDINGS]]
            more = len(found) - len(names)
            text += f" ({', '.join(names)}{f', and {more} more' if more else ''})"
        parts.append(text)
    return html.escape(f"lanes ended: {'; '.join(parts)}")


def _ended_name(summary: LaneSummary, several_ranks: bool) -> str:
    name = summary.lane.label(several_ranks)
    if summary.as_of_ns is not None:
        name += f" as of {axis_time(summary.as_of_ns)[:19]} UTC"
    return name


def render_html(timeline: Timeline) -> str:
    """The whole page as one string (:func:`page_pieces` joined)."""
    return b"".join(page_pieces(timeline)).decode()
