"""The timeline of a job of many ranks: alike ranks share a lane, the page's height is
bounded, and the header summarises how the lanes ended instead of listing every one."""

from __future__ import annotations

import re
from pathlib import Path

import tracegen as g

from megatron.trace.otlp.spans import span_source
from megatron.trace.render.lanes import Lane
from megatron.trace.render.timeline import write as timeline
from megatron.trace.render.timeline.page import (
    LANES_PX,
    MIN_LANE_PX,
    endings_text,
    files_text,
    lane_layout,
    rank_list,
)
from megatron.trace.render.timeline.summary import summary_figure

RANKS = 64


def _in_step(tmp_path: Path, killed: int | None = 5) -> list[Path]:
    """64 ranks running in step; rank ``killed`` SIGKILLed after its first interval and
    restarted from its checkpoint."""
    files = []
    for rank in range(RANKS):
        path = tmp_path / f"rank{rank}.jsonl"
        if rank == killed:
            g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(12, first=2, load=2), rank=rank)
        else:
            g.write(path, g.lifecycle(0), rank=rank)
        files.append(path)
    return files


def _labels(fig) -> list[str]:
    return [
        re.sub("<[^>]+>", " ", text).split("  ")[0].strip() for text in fig.layout.yaxis.ticktext
    ]


def test_ranks_in_step_share_one_lane_and_the_odd_one_stands_out(tmp_path: Path) -> None:
    files = _in_step(tmp_path)
    tl = timeline.collect(span_source(files), [str(f) for f in files])
    assert [s.lane for s in tl.lanes] == [Lane(0, "0"), Lane(0, "5"), Lane(1, "5")]
    assert tl.lanes[0].alike == [str(r) for r in range(1, RANKS) if r != 5]
    assert tl.lanes[1].alike == tl.lanes[2].alike == []
    assert len(tl.all_lanes) == RANKS + 1 and tl.ranks == RANKS

    fig = timeline.figure(tl)
    assert _labels(fig) == [
        "incarnation 0 · ranks 0–4, 6–63 (63 alike)",
        "incarnation 0 · rank 5",
        "incarnation 1 · rank 5",
    ]
    # only the drawn lanes' bars: rank 0's three intervals, then rank 5's, not 62 copies
    [intervals] = [t for t in fig.data if t.name == "training interval"]
    every = [bar.lane for bar in tl.bars if bar.category == "interval"]
    drawn = {s.lane: row for row, s in enumerate(tl.lanes)}
    assert len(every) > 3 * RANKS
    assert sorted(intervals.y) == sorted(drawn[lane] for lane in every if lane in drawn)
    assert sorted(intervals.y)[:4] == [0, 0, 0, 1]
    assert fig.layout.height < 1000  # was 230 + 90 px for each of 65 lanes
    assert list(fig.layout.yaxis.range) == [2.5, -0.5]  # no empty band above the lanes


def test_the_header_summarises_the_endings(tmp_path: Path) -> None:
    files = _in_step(tmp_path)
    tl = timeline.collect(span_source(files), [str(f) for f in files])
    assert endings_text(tl) == "lanes ended: 64 shut down; 1 killed (incarnation 0 · rank 5)"
    page = timeline.render_html(tl)
    assert "lanes ended: 64 shut down; 1 killed (incarnation 0 · rank 5)" in page
    assert "rank 17: shut down" not in page  # no entry per lane
    assert "ranks <b>64</b>" in page
    assert f"64 files: {files[0]} {files[1]} {files[2]} … " in page
    assert "share one lane, which names them" in page


def test_many_different_ranks_keep_the_page_height_bounded(tmp_path: Path) -> None:
    # each rank starts a second after the one before: no two alike
    files = []
    for rank in range(RANKS):
        files.append(g.write(tmp_path / f"rank{rank}.jsonl", g.lifecycle(rank), rank=rank))
    tl = timeline.collect(span_source(files), [str(f) for f in files])
    assert len(tl.lanes) == RANKS and not any(s.alike for s in tl.lanes)
    px, in_view = lane_layout(RANKS)
    assert (px, in_view) == (MIN_LANE_PX, LANES_PX // MIN_LANE_PX)
    fig = timeline.figure(tl)
    assert fig.layout.height <= 230 + LANES_PX + 120  # lanes, margins and the goodput strip
    assert list(fig.layout.yaxis.range) == [in_view - 0.5, -0.5]  # the rest scroll
    assert len(fig.layout.yaxis.ticktext) == RANKS  # every lane is there to scroll to
    assert "<br>" not in fig.layout.yaxis.ticktext[0]  # thin lanes: one-line labels
    page = timeline.render_html(tl)
    assert f"{in_view} of the {RANKS} lanes are in view" in page
    assert "lanes ended: 64 shut down" in page


def test_a_few_lanes_keep_their_full_height() -> None:
    assert lane_layout(1) == (90, 1)
    assert lane_layout(3) == (90, 3)
    assert lane_layout(20) == (LANES_PX // 20, 20)


def test_rank_lists_read_as_ranges() -> None:
    assert rank_list(["0", "1", "2", "4", "6", "7"]) == "0–2, 4, 6–7"
    assert rank_list(["a", "b"]) == "a, b"
    assert files_text(["a", "b"]) == "a b"


def test_the_goodput_bar_starts_with_startup(tmp_path: Path) -> None:
    # the stacked bar in the order a job meets its categories: startup first, not last
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    tl = timeline.collect(span_source([path]), [str(path)])
    names = [trace.name for trace in summary_figure(tl.report).data]
    assert names == ["startup", "goodput", "checkpoint save"]


def test_the_hung_rank_and_the_ranks_waiting_for_it_keep_lanes_of_their_own(
    tmp_path: Path,
) -> None:
    """A hang at the same moment on every rank, the culprit (not waiting in the
    all-reduce) on rank 2: the ranks waiting for it share a lane, the culprit stands out."""
    trace = tmp_path / "traces.jsonl"
    for rank in range(4):
        g.write(trace, g.lifecycle(0), g.hung(6.25, waiting=rank != 2, start=25), rank=rank)
    tl = timeline.collect(span_source([trace]), [str(trace)])
    assert [s.lane.rank for s in tl.lanes if s.lane.incarnation == 1] == ["0", "2"]
    waiting = next(s for s in tl.lanes if s.lane == Lane(1, "0"))
    assert waiting.alike == ["1", "3"]
