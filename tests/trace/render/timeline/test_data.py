"""The timeline's goodput line: ``report --window``'s windows, drawn over the lanes.

The line is the report's own accounting per window (not derived again by the page):
its steps are the windows' goodput fractions, at the windows' starts, on the
lanes' time axis; a job killed and resumed shows the drop in the window of the kill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tracegen as g

from megatron.trace.analysis.accounting import wall_bounds_ns
from megatron.trace.analysis.goodput import build_report
from megatron.trace.model.builder import load_trace
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.timeline import page as timeline_page
from megatron.trace.render.timeline import write as timeline
from megatron.trace.render.timeline.data import LINE_WINDOWS, line_window_ns

S = 1_000_000_000


@pytest.mark.parametrize(
    ("wall_s", "window_s"),
    [(0.2, 1), (50, 1), (51, 2), (600, 15), (86_400, 1800), (7 * 86_400, 6 * 3600)],
)
def test_the_window_is_a_round_width_giving_at_most_fifty_windows(
    wall_s: float, window_s: int
) -> None:
    assert line_window_ns(round(wall_s * S)) == window_s * S
    assert wall_s / window_s <= LINE_WINDOWS


def _killed_and_resumed(tmp_path: Path) -> Path:
    return g.write(
        tmp_path / "t.jsonl",
        g.lifecycle(0, kill_after=1, intervals=6),
        g.lifecycle(40, first=6, load=6, intervals=6),
    )


def _line(tl: timeline.Timeline) -> tuple[Any, Any]:  # the figure, the line's trace
    fig = timeline.figure(tl)
    [line] = [t for t in fig.data if t.name and t.name.startswith("goodput per")]
    return fig, line


@pytest.mark.needs_extras  # the figure is plotly's
def test_the_line_is_the_reports_windows(tmp_path: Path) -> None:
    path = _killed_and_resumed(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    trace = load_trace([path])
    start, end = wall_bounds_ns(next(iter(trace.ranks.values())))
    window_ns = line_window_ns(end - start)
    entries = build_report(trace, window_ns=window_ns)["windows"]["entries"]
    assert len(entries) > 10
    fig, line = _line(tl)
    # a step per window, from its start, and a last point where the last window ends
    assert list(line.y[:-1]) == [pytest.approx(100 * e["goodput_fraction"]) for e in entries]
    assert line.y[-1] == line.y[-2]
    assert [w.start_ns for w in tl.windows] == [start + round(e["start_s"] * S) for e in entries]
    assert tl.windows[-1].end_ns == end
    assert list(line.x) == [timeline_page.axis_time(start + round(e["start_s"] * S))
                            for e in entries] + [timeline_page.axis_time(end)]  # fmt: skip
    # its own axis, in a strip above the lanes, on the lanes' time axis
    assert line.yaxis == "y2" and line.showlegend is not False
    assert fig.layout.yaxis2.anchor == "x" and tuple(fig.layout.yaxis2.range) == (0, 105)
    assert fig.layout.yaxis2.domain[0] > fig.layout.yaxis.domain[1]
    for window, text in zip(tl.windows, line.hovertext, strict=False):
        assert f"goodput {100 * window.entry['goodput_fraction']:.1f} %" in text
    # the summary is still the plain report (the windows are the line's, not the summary's)
    assert "windows" not in tl.report
    assert tl.report["accounting_ns"] == build_report(trace)["accounting_ns"]


@pytest.mark.needs_extras  # the figure is plotly's
def test_a_kill_shows_as_a_drop_in_its_window(tmp_path: Path) -> None:
    path = _killed_and_resumed(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    _, line = _line(tl)
    killed = next(s for s in tl.lanes if s.ended == "killed")
    values = list(line.y[:-1])
    at_kill = next(i for i, w in enumerate(tl.windows) if w.start_ns <= killed.end_ns < w.end_ns)
    # training runs at most of the wall clock before and after; after the kill, the
    # wasted progress and the restart gap bring the line to the floor
    assert max(values[:at_kill]) > 60
    assert max(values[at_kill + 1 :]) > 60
    assert min(values[at_kill : at_kill + 3]) == 0
    after = tl.windows[at_kill + 1].entry["top_badput"]
    assert after and after[0] in {"restart_gap", "startup", "wasted_progress"}


@pytest.mark.needs_extras  # the figure is plotly's
def test_the_page_names_the_line(tmp_path: Path) -> None:
    path = _killed_and_resumed(tmp_path)
    page = timeline.render_html(timeline.collect(span_source([path]), [str(path)]))
    assert "goodput per 2.00 s window (top strip)" in page
    assert '"yaxis":"y2"' in page.replace(" ", "")
