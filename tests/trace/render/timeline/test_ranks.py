"""The timeline's hang bars and per-rank iteration panel, on hand-built files with known answers."""

from __future__ import annotations

from pathlib import Path

import tracegen as g

from megatron.trace.analysis.goodput import report_files
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.lanes import Lane
from megatron.trace.render.timeline import ranks as timeline_ranks
from megatron.trace.render.timeline import write as timeline


def two_ranks(tmp_path: Path, rank0: list[dict], rank1: list[dict]) -> Path:
    path = tmp_path / "t.jsonl"
    g.write(path, rank0, rank=0)
    g.write(path, rank1, rank=1)
    return path


def test_a_hang_is_drawn_as_the_report_counts_it(tmp_path: Path) -> None:
    path = two_ranks(tmp_path, g.hung(6.25, waiting=True), g.hung(6.26, waiting=False))
    tl = timeline.collect(span_source([path]))
    hangs = sorted((b for b in tl.bars if b.category == "hang"), key=lambda b: b.lane.rank)
    assert [(b.lane, b.start_ns, b.end_ns) for b in hangs] == [
        (Lane(0, rank), round(5.25 * g.SECOND), round(9.25 * g.SECOND)) for rank in ("0", "1")
    ]
    assert report_files([path])["badput_s"]["hang"] == (hangs[0].end_ns - hangs[0].start_ns) / 1e9
    assert "stopped in its own work: the culprit" in hangs[1].details
    assert "waiting for other ranks" in hangs[0].details
    assert "at /x/fault_injection.py:70 in _hang" in hangs[1].details
    page = timeline.render_html(tl)
    assert "hang (no progress)" in page
    assert "hang: rank 1 (culprit) <b>4.00 s</b> after iteration 2" in page


def test_the_panel_splits_each_ranks_iterations_into_work_and_wait(tmp_path: Path) -> None:
    path = two_ranks(
        tmp_path,
        g.with_waits(g.lifecycle(0, intervals=4, per=3), 0.6),
        g.with_waits(g.lifecycle(0, intervals=4, per=3), 0.1),
    )
    tl = timeline.collect(span_source([path]))
    assert [(s.rank, s.iteration, s.per_point) for s in tl.series] == [
        (rank, list(range(12)), 1) for rank in ("0", "1")
    ]
    assert [s.work_ms for s in tl.series] == [[400.0] * 12, [900.0] * 12]
    assert [s.total_ms for s in tl.series] == [[1000.0] * 12] * 2
    fig = timeline_ranks.ranks_figure(tl.series, tl.report)
    names = [trace.name for trace in fig.data]
    assert names == [
        "rank 0 work (score 1.00)",
        "rank 0 iteration",
        "rank 1 work (score 0.44 · straggler)",
        "rank 1 iteration",
    ]
    assert (
        "stragglers: rank 1; time lost waiting for the stragglers 5.00 s" in fig.layout.title.text
    )
    assert 'id="iterations"' in timeline.render_html(tl)


def test_incarnations_break_the_line_and_long_runs_are_reduced(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.jsonl"
    g.write(path, g.lifecycle(0, intervals=2), g.lifecycle(20, first=4, load=4))
    (series,) = timeline.collect(span_source([path])).series
    assert series.iteration == [0, 1, 2, 3, None, 4, 5, 6, 7, 8, 9]
    assert series.work_ms == []  # no waits: iteration times only
    monkeypatch.setattr(timeline_ranks, "MAX_POINTS", 4)
    (series,) = timeline.collect(span_source([path])).series
    assert series.per_point == 3  # 10 iterations in at most 4 points
    assert series.iteration == [0, 3, None, 4, 7]
    fig = timeline_ranks.ranks_figure([series], None)
    assert "each point: the median of 3 iterations" in fig.layout.title.text


def test_no_panel_without_iteration_spans(tmp_path: Path) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0, iterations=False))
    tl = timeline.collect(span_source([path]))
    assert tl.series == []
    assert 'id="iterations"' not in timeline.render_html(tl)


def test_the_note_under_the_panel_explains_only_the_lines_drawn(tmp_path: Path) -> None:
    """Without gradient-sync spans there is no work line: the note says what would add one."""
    alone = timeline.render_html(timeline.collect(span_source([g.write(
        tmp_path / "alone.jsonl", g.lifecycle(0, intervals=2))])))  # fmt: skip
    assert "Dotted: each rank's whole iteration" in alone
    assert "Solid:" not in alone
    path = two_ranks(
        tmp_path,
        g.with_waits(g.lifecycle(0, intervals=4, per=3), 0.6),
        g.with_waits(g.lifecycle(0, intervals=4, per=3), 0.1),
    )
    split = timeline.render_html(timeline.collect(span_source([path])))
    assert "Solid: a rank's own work per iteration" in split
    assert "Dotted: each rank's" not in split
