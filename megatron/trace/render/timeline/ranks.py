"""The timeline's per-rank iteration-time panel: what the straggler figures look like.

One line per rank of its own work per iteration (the iteration minus its
gradient all-reduce wait, as ``report`` splits it), over the iteration
number, with each rank's whole iteration time beside it, dotted. A slow rank
is the line that sits high while every rank's iterations last the same: the
others spent the difference waiting for it. Without the gradient-sync spans
only the iteration times are drawn.

A long run has millions of iterations, so each rank's series is reduced to at
most :data:`MAX_POINTS` points, each the median of a run of consecutive
iterations. Incarnations are separate segments of the line.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from megatron.trace.analysis.stragglers import iteration_work
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.render.timeline.summary import duration_text

__all__ = ["MAX_POINTS", "RankSeries", "rank_series", "ranks_figure"]

MAX_POINTS = 2000
#: With more ranks than this the legend lists only the stragglers (hover names any line).
LEGEND_RANKS = 8


@dataclass
class RankSeries:
    """One rank's iteration times; ``None`` entries break the line between incarnations."""

    rank: str
    iteration: list[int | None] = field(default_factory=list)
    total_ms: list[float | None] = field(default_factory=list)
    work_ms: list[float | None] = field(default_factory=list)  # empty without waits
    per_point: int = 1  # iterations per point (their medians), to keep MAX_POINTS

    @property
    def points(self) -> int:
        return sum(1 for number in self.iteration if number is not None)


def _points(inc: Incarnation, step: int) -> Iterator[tuple[int, float, float | None]]:
    """Each run of ``step`` iterations (the last one shorter) as one point: its first
    number, the median iteration ms and the median work ms (None: no wait spans)."""
    import numpy as np  # here, not at import: the CLI starts faster for what needs none

    numbers, durations, _, work = iteration_work(inc)
    if step == 1:  # each iteration its own point (what the medians of one give, faster)
        works = [None if value < 0 else value / 1e6 for value in work.tolist()]
        yield from zip(numbers.tolist(), (durations / 1e6).tolist(), works, strict=True)
        return
    for at in range(0, len(numbers), step):
        works = work[at : at + step]
        works = works[works >= 0]
        yield (
            int(numbers[at]),
            float(np.median(durations[at : at + step] / 1e6)),
            float(np.median(works / 1e6)) if len(works) else None,
        )


def rank_series(trace: Trace) -> list[RankSeries]:
    """Each rank's series (ranks without finished iterations are left out)."""
    found = []
    for rank, incs in trace.ranks.items():
        count = sum(len(inc.iterations) for inc in incs)
        if not count:
            continue
        step = max(1, -(-count // MAX_POINTS))
        series = RankSeries(rank, per_point=step)
        # each incarnation's points (at most MAX_POINTS in all), then whether any has work
        segments = [list(_points(inc, step)) for inc in incs if inc.iterations]
        has_work = any(work is not None for points in segments for _, _, work in points)
        for position, points in enumerate(segments):
            if position:  # a break in the line between incarnations
                series.iteration.append(None)
                series.total_ms.append(None)
                if has_work:
                    series.work_ms.append(None)
            for number, total, work in points:
                series.iteration.append(number)
                series.total_ms.append(total)
                if has_work:
                    series.work_ms.append(work)
        found.append(series)
    return found


_RANK_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def ranks_figure(series: list[RankSeries], report: dict[str, Any] | None) -> Any:
    """The panel (plotly figure): work per iteration per rank, iteration time dotted."""
    import plotly.graph_objects as go

    entries = {str(entry["rank"]): entry for entry in (report or {}).get("ranks", [])}
    fig = go.Figure()
    for position, one in enumerate(series):
        colour = _RANK_COLOURS[position % len(_RANK_COLOURS)]
        entry = entries.get(one.rank, {})
        flag = " · straggler" if entry.get("straggler") else ""
        listed = len(series) <= LEGEND_RANKS or bool(flag)
        if one.work_ms:
            score = entry.get("score")
            scored = f" (score {score:.2f}{flag})" if score is not None else ""
            fig.add_trace(
                go.Scatter(
                    name=f"rank {one.rank} work{scored}",
                    x=one.iteration,
                    y=one.work_ms,
                    mode="lines",
                    line={"color": colour, "width": 3 if flag else 1.5},
                    showlegend=listed,
                    hovertemplate=f"rank {one.rank}<br>iteration %{{x}}<br>work %{{y:.1f}} ms"
                    "<extra></extra>",
                )
            )
        fig.add_trace(
            go.Scatter(
                name=f"rank {one.rank} iteration",
                x=one.iteration,
                y=one.total_ms,
                mode="lines",
                line={"color": colour, "width": 1, "dash": "dot"},
                opacity=0.7,
                showlegend=listed,
                hovertemplate=f"rank {one.rank}<br>iteration %{{x}}<br>iteration %{{y:.1f}} ms"
                "<extra></extra>",
            )
        )
    fig.update_layout(
        title={"text": _title(series, report), "font": {"size": 15}, "x": 0, "xanchor": "left"},
        height=380,
        margin={"l": 60, "r": 20, "t": 70, "b": 100},
        plot_bgcolor="white",
        font={"family": "Helvetica, Arial, sans-serif", "size": 13},
        # Below the axis, so it never covers a line.
        legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0, "x": 0},
        hovermode="closest",
    )
    numbers = [n for one in series for n in one.iteration if n is not None]
    few = bool(numbers) and max(numbers) - min(numbers) <= 12
    fig.update_xaxes(
        title={"text": "iteration"},
        tickformat="d",
        dtick=1 if few else None,  # whole iterations only, never 0.5
        showgrid=True,
        gridcolor="#eee",
        zeroline=False,
    )
    fig.update_yaxes(
        title={"text": "ms"}, showgrid=True, gridcolor="#eee", rangemode="tozero", zeroline=False
    )
    return fig


def _title(series: list[RankSeries], report: dict[str, Any] | None) -> str:
    """The panel's title, and beneath it, smaller, the straggler verdict and the sampling."""
    title = "Iteration time per rank"
    if any(one.work_ms for one in series):
        title += " · work = iteration − gradient all-reduce wait"
    notes = []
    found = (report or {}).get("stragglers")
    if found is not None:
        names = ", ".join(f"rank {rank}" for rank in found["ranks"]) or "none"
        note = f"stragglers: {names}"
        lost = report.get("straggler_s")
        if lost is not None:
            note += f"; time lost waiting for the stragglers {duration_text(lost)}"
        notes.append(note)
    if len(series) > LEGEND_RANKS:
        notes.append(f"{len(series)} ranks: the legend lists the stragglers, hover names a line")
    per_point = max((one.per_point for one in series), default=1)
    if per_point > 1:
        notes.append(f"each point: the median of {per_point} iterations")
    if notes:
        title += (
            f"<br><span style='font-size:13px;color:#444'>{html.escape('; '.join(notes))}</span>"
        )
    return title
