"""``megatron-trace timeline`` on hand-built trace files: lanes, bars, endings, the page.

What is checked is what a reader of the page relies on: a lane per incarnation
(and rank), the bars of each category with the right extents and iteration
ranges, how each incarnation ended, and that the page carries plotly.js itself
(it must open offline). That it renders in a browser is ``tox -e browser``.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest
from pictures_helpers import T0, S, Span, incarnation, resource, run_command, write_trace

from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.liveness import Clock
from megatron.trace.analysis.reasons import reason_text, reasons_once
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.lanes import Lane
from megatron.trace.render.timeline import page as timeline_page
from megatron.trace.render.timeline import write as timeline
from megatron.trace.render.timeline.summary import duration_text, summary_figure


def killed_then_resumed(tmp_path: Path) -> Path:
    """Incarnation 1 saves at 4, is killed in C1 after iterations 4-5; 2 resumes at 4."""
    first = incarnation(0, 0, 1, queue=5)
    c0 = next(s for s in first if s.name == "megatron.train")
    lost = Span("megatron.train", c0.end, c0.end + 10, links=[c0])  # never written
    orphans = [lost.child("megatron.train.iteration", c0.end + i, c0.end + i + 1,
                          **{"megatron.iteration": 4 + i}) for i in range(2)]  # fmt: skip
    second = incarnation(30, 4, 2)
    second[-1].attributes["megatron.span.cut_short"] = True  # SIGTERM at its very end
    return write_trace(
        tmp_path / "traces.jsonl",
        [(resource("job", 0, 100), first + orphans), (resource("job", 0, 200), second)],
    )


def bars(tl: timeline.Timeline, category: str) -> list[timeline.Bar]:
    return sorted((b for b in tl.bars if b.category == category), key=lambda b: b.start_ns)


def test_one_lane_per_incarnation_with_its_ending(tmp_path: Path) -> None:
    tl = timeline.collect(span_source([killed_then_resumed(tmp_path)]))
    assert [(s.lane, s.ended) for s in tl.lanes] == [
        (Lane(0, "0"), "killed"),
        (Lane(1, "0"), "cut_short"),
    ]
    assert not tl.several_ranks


def test_bars_by_category_with_their_extents(tmp_path: Path) -> None:
    tl = timeline.collect(span_source([killed_then_resumed(tmp_path)]))
    [queue] = bars(tl, "queue")
    assert (queue.lane, queue.start_ns, queue.end_ns) == (Lane(0, "0"), T0 - 5 * S, T0)
    intervals = bars(tl, "interval")
    assert [(b.lane.incarnation, b.text) for b in intervals] == [
        (0, "C0 · 0–3"),
        (1, "C0 · 4–7"),
        (1, "C1 · 8–11"),
    ]
    assert "iterations 4–7" in intervals[1].details
    assert [b.name for b in bars(tl, "startup_phase")] == ["megatron.startup.imports",
            "megatron.startup.model_init"] * 2  # fmt: skip
    assert [b.lane.incarnation for b in bars(tl, "checkpoint_load")] == [1]
    assert len(bars(tl, "checkpoint_save")) == len(bars(tl, "evaluation")) == 3
    assert "at iteration 4" in bars(tl, "checkpoint_save")[0].details


def test_wasted_progress_is_drawn_as_the_report_counts_it(tmp_path: Path) -> None:
    path = killed_then_resumed(tmp_path)
    tl = timeline.collect(span_source([path]))
    [wasted] = bars(tl, "wasted")
    c0_end = T0 + 8 * S  # startup 3 s, four 1 s iterations, 1 s of eval and save
    assert (wasted.lane, wasted.start_ns, wasted.end_ns) == (Lane(0, "0"), c0_end, c0_end + 2 * S)
    assert wasted.text == "wasted · 4–5"
    assert wasted.details[:3] == [
        "2 iterations (4–5) whose results were lost",
        "killed: its interval in flight was never written (SIGKILL)",
        "incarnation 1 resumed from iteration 4",
    ]
    report = report_files([path])
    assert report["wasted_iterations"] == 2
    assert report["badput_s"]["wasted_progress"] == (wasted.end_ns - wasted.start_ns) / S


def test_the_restart_gap_runs_from_the_last_span_to_the_next_start(tmp_path: Path) -> None:
    tl = timeline.collect(span_source([killed_then_resumed(tmp_path)]))
    [gap] = bars(tl, "restart_gap")
    assert (gap.lane, gap.start_ns, gap.end_ns) == (Lane(1, "0"), T0 + 10 * S, T0 + 30 * S)


def test_several_ranks_get_a_lane_each(tmp_path: Path) -> None:
    # ranks that do not look alike (rank 1 runs an interval more): one lane each
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            (resource("job", rank, 10 + rank), incarnation(0.01 * rank, 0, 2 + rank))
            for rank in (0, 1)
        ],
    )
    tl = timeline.collect(span_source([path]))
    assert tl.several_ranks
    assert [s.lane for s in tl.lanes] == [Lane(0, "0"), Lane(0, "1")]
    assert [lane.label(True) for lane in (Lane(0, "0"), Lane(0, "1"))] == [
        "incarnation 0 · rank 0",
        "incarnation 0 · rank 1",
    ]
    assert {b.lane for b in bars(tl, "interval")} == {Lane(0, "0"), Lane(0, "1")}


def test_the_page_is_self_contained_and_names_every_lane(tmp_path: Path) -> None:
    out = tmp_path / "timeline.html"
    assert run_command(timeline, [str(killed_then_resumed(tmp_path)), "-o", str(out)]) == 0
    page = out.read_text()
    from plotly.offline import get_plotlyjs_version

    assert f"plotly.js v{get_plotlyjs_version()}" in page  # the bundle itself, embedded
    assert not re.search(r"<script[^>]+src=", page), "the page must not load scripts from anywhere"
    expected = [
        *("incarnation 0", "incarnation 1", "killed", "cut short", "C1 · 8–11"),
        *("2 iterations (4–5) whose results were lost", "restart gap", "scheduler queue"),
        "checkpoint save",
    ]
    for text in expected:
        assert text in page or json.dumps(text)[1:-1] in page, text


def test_without_plotly_it_exits_2_naming_the_extra(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)
    out = tmp_path / "timeline.html"
    assert run_command(timeline, [str(killed_then_resumed(tmp_path)), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "megatron-trace timeline: error: timeline needs the plotly package: "
        "pip install 'megatron-telemetry-spans[trace]'"
    ]
    assert "pip install 'megatron-telemetry-spans[trace]'" in err[0]
    assert not out.exists()


def test_a_missing_file_is_one_error_line_and_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "timeline.html"
    assert run_command(timeline, [str(tmp_path / "nope.jsonl"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jsonl" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("several_ranks", [False, True])
def test_the_figure_has_a_row_per_lane(tmp_path: Path, several_ranks: bool) -> None:
    ranks = (0, 1) if several_ranks else (0,)
    # rank r runs 1 + r intervals: no two ranks look alike
    processes = [(resource("job", r, 10 + r), incarnation(0, 0, 1 + r)) for r in ranks]
    processes += [(resource("job", r, 20 + r), incarnation(40, 8, 1 + r)) for r in ranks]
    tl = timeline.collect(span_source([write_trace(tmp_path / "t.jsonl", processes)]))
    fig = timeline.figure(tl)
    assert list(fig.layout.yaxis.tickvals) == list(range(2 * len(ranks)))
    labels = [re.sub("<[^>]+>", " ", t).split("  ")[0].strip() for t in fig.layout.yaxis.ticktext]
    expected = [Lane(i, str(r)).label(several_ranks) for i in (0, 1) for r in ranks]
    assert labels == expected
    [interval_trace] = [t for t in fig.data if t.name == "training interval"]
    # a bar per interval, in its lane's row: rank r's lanes hold 1 + r intervals each
    expected_rows = [row for row, (_, r) in enumerate((i, r) for i in (0, 1) for r in ranks)
                     for _ in range(1 + r)]  # fmt: skip
    assert sorted(interval_trace.y) == expected_rows


def test_the_goodput_summary_is_the_report(tmp_path: Path) -> None:
    path = killed_then_resumed(tmp_path)
    clock = Clock.system()
    tl = timeline.collect(span_source([path]), [str(path)], clock)
    report = report_files([path], clock)
    assert tl.report == report
    page = timeline.render_html(tl)
    # a SIGKILL kept the end of the killed run from the file: the page says the bounds
    # report gives, as report's text does, and each reason once
    bounds = report["bounds"]
    gap, wasted = bounds["badput_s.restart_gap"], bounds["wasted_iterations"]
    wall = report["wall_s"]
    assert gap["lower"] < gap["upper"] == report["badput_s"]["restart_gap"]
    shares = f"{100 * gap['lower'] / wall:.1f}–{100 * gap['upper'] / wall:.1f} %"
    assert f"restart gap {shares}" in page  # among the largest badput
    assert f"wasted iterations <b>≥ {wasted['lower']}</b>" in page
    # resumed from the save of 4 the file shows: the lost seconds kept nothing
    assert "goodput_s" not in bounds
    good = report["goodput_s"]
    assert f"goodput <b>{100 * good / wall:.1f} %</b> ({duration_text(good)})" in page
    for reason in reasons_once(bound["reason"] for bound in bounds.values()):
        said = reason_text(reason)
        assert f"<div class='note'>bounded: {html.escape(said)}</div>" in page
    fig = summary_figure(report)
    shares = {trace.name: trace.x[0] for trace in fig.data}
    assert shares["goodput"] == report["goodput_s"]
    assert sum(shares.values()) == pytest.approx(report["wall_s"])
    assert shares["wasted progress"] == report["badput_s"]["wasted_progress"] > 0


def test_a_file_without_spans_is_one_error_line_and_exit_2(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "traces.jsonl"
    empty.write_text("\n")
    out = tmp_path / "timeline.html"
    assert run_command(timeline, [str(empty), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"megatron-trace timeline: error: no spans in {empty}"
    ]
    assert not out.exists()


def test_an_output_that_cannot_be_written_is_one_error_line_and_exit_2(tmp_path, capsys) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), incarnation(0, 0, 1))])
    out = tmp_path / "timeline.html"
    out.mkdir()  # a directory where the file should go
    assert run_command(timeline, [str(trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"megatron-trace timeline: error: cannot write {out}"
    )
    assert out.is_dir() and list(tmp_path.glob(".*.tmp")) == []


def _hostile_page_trace(tmp_path: Path) -> Path:
    """A job whose interval carries text that could end a script or a JavaScript string."""
    spans = incarnation(0, 0, 1)
    interval = next(s for s in spans if s.name == "megatron.train")
    interval.attributes["note"] = "</script><script>alert(1)</script> \u2028 \u2029 é – … 日本"
    return write_trace(tmp_path / "traces.jsonl", [(resource("job", 0, 100), spans)])


def test_a_plot_is_plotlys_markup_around_the_traces_msgspec_encodes(tmp_path: Path) -> None:
    """Conformance with plotly's own ``to_html``: the markup, layout and config byte for
    byte, the traces the same JSON value, and nothing in them that could end the
    script or a JavaScript string (escaped as plotly escapes it)."""
    import plotly.io as pio

    path = _hostile_page_trace(tmp_path)
    fig = timeline.figure(timeline.collect(span_source([path]), [str(path)]))
    config = {"displaylogo": False}
    before, data, after = timeline_page.plot_div(fig, "timeline", config)
    theirs = fig.to_html(full_html=False, include_plotlyjs=False, div_id="timeline", config=config)
    their_data = pio.json.to_json_plotly(fig.to_plotly_json()["data"])
    assert before + their_data + after == theirs
    assert json.loads(data) == json.loads(their_data)
    text = data.decode()
    assert "alert(1)" in text
    for unsafe in ("<", ">", "/", "\u2028", "\u2029"):
        assert unsafe not in text
    assert "日本" in text  # raw UTF-8, as the page declares


def test_the_page_is_written_as_it_renders(tmp_path: Path) -> None:
    path = _hostile_page_trace(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    out = tmp_path / "timeline.html"
    timeline.write_page(tl, out)
    page = out.read_text(encoding="utf-8")
    assert page == timeline.render_html(tl)
    assert page.count('class="plotly-graph-div"') == 3  # goodput bar, lanes, iteration times
    assert "<!-- megatron-trace" not in page


def test_without_msgspec_a_plot_is_plotlys_own_markup(tmp_path: Path, monkeypatch) -> None:
    path = _hostile_page_trace(tmp_path)
    fig = timeline.figure(timeline.collect(span_source([path]), [str(path)]))
    monkeypatch.setitem(sys.modules, "msgspec", None)  # import msgspec raises ImportError
    config = {"displaylogo": False}
    assert timeline_page.plot_div(fig, "timeline", config) == [
        fig.to_html(full_html=False, include_plotlyjs=False, div_id="timeline", config=config)
    ]


def _lanes_html(tl: timeline.Timeline) -> tuple[str, bytes, str]:
    """The streamed lanes plot as (markup before, the traces' JSON, markup after)."""
    pieces = timeline_page.lanes_plot(tl, "timeline", {"displaylogo": False})
    before, *data, after = pieces
    assert isinstance(before, str) and isinstance(after, str)
    return before, b"".join(timeline_page.piece_bytes(data)), after


@pytest.mark.parametrize("trace", [_hostile_page_trace, killed_then_resumed])
@pytest.mark.parametrize("encoder", ["msgspec", "stdlib"])
def test_the_streamed_lanes_are_plotlys_page_of_the_whole_figure(
    tmp_path: Path, monkeypatch, trace, encoder: str
) -> None:
    """The bars' arrays go through temporary columns (a value a chunk here, so every
    array is spliced from several), yet the page is plotly's ``to_html`` of the figure
    holding every bar: markup byte for byte, traces the same JSON, nothing that ends
    the script."""
    import plotly.io as pio

    from megatron.trace._store import json_columns

    monkeypatch.setattr(json_columns, "CHUNK_VALUES", 1)
    if encoder == "stdlib":
        monkeypatch.setitem(sys.modules, "msgspec", None)
    path = trace(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    fig = timeline.figure(tl)
    assert any(len(t.y) > 1 for t in fig.data)  # some array spans chunks
    before, data, after = _lanes_html(tl)
    config = {"displaylogo": False}
    theirs = fig.to_html(full_html=False, include_plotlyjs=False, div_id="timeline", config=config)
    their_data = pio.json.to_json_plotly(fig.to_plotly_json()["data"])
    assert before + their_data + after == theirs
    assert json.loads(data) == json.loads(their_data)
    for unsafe in ("<", ">", "/", "\u2028", "\u2029"):
        assert unsafe not in data.decode()


def test_the_bars_are_made_again_not_held(tmp_path: Path) -> None:
    path = killed_then_resumed(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    assert not isinstance(tl.bars, list)
    first, again = list(tl.bars), list(tl.bars)
    assert first == again and {b.category for b in first} >= {"interval", "wasted"}


def test_if_plotlys_markup_changes_the_lanes_are_plotlys_own(tmp_path, monkeypatch) -> None:
    path = killed_then_resumed(tmp_path)
    tl = timeline.collect(span_source([path]), [str(path)])
    fig = timeline.figure(tl)
    config = {"displaylogo": False}
    theirs = fig.to_html(full_html=False, include_plotlyjs=False, div_id="timeline", config=config)
    monkeypatch.setattr(timeline_page, "_markup", lambda *args: None)
    assert timeline_page.lanes_plot(tl, "timeline", config) == [theirs]
