"""The timeline page, loaded in headless Chromium: it renders its lanes, offline, error-free.

The unit tests check the figure plotly is given; only a browser shows that
plotly.js (embedded in the page) actually draws it: a y-axis label per lane,
a bar per interval, hover text, and no JavaScript error on the way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pictures_helpers import Span, incarnation, resource, write_trace

from megatron.trace.otlp.spans import span_source
from megatron.trace.render.timeline import write as timeline


def write_page(tmp_path: Path, ranks: tuple[int, ...]) -> tuple[Path, timeline.Timeline]:
    processes = []
    for rank in ranks:
        first = incarnation(0.1 * rank, 0, 2, queue=4)
        c1 = [s for s in first if s.name == "megatron.train"][-1]
        lost = Span("megatron.train", c1.end, c1.end + 10, links=[c1])
        first.append(lost.child("megatron.train.iteration", c1.end, c1.end + 1,
                                **{"megatron.iteration": 8}))  # fmt: skip
        processes.append((resource("job", rank, 100 + rank), first))
    processes += [(resource("job", r, 200 + r), incarnation(40 + 0.1 * r, 8, 3)) for r in ranks]
    trace = write_trace(tmp_path / "traces.jsonl", processes)
    tl = timeline.collect(span_source([trace]), [str(trace)])
    out = tmp_path / "timeline.html"
    timeline.write_page(tl, out)
    return out, tl


def load(browser: Any, page_path: Path) -> tuple[Any, list[str]]:
    # No network at all: the page must carry everything it needs.
    context = browser.new_context(offline=True, viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(page_path.as_uri())
    page.wait_for_selector("#timeline .barlayer .trace", timeout=30_000)
    return page, errors


@pytest.mark.parametrize("ranks", [(0,), (0, 1)], ids=["one rank", "two ranks"])
def test_the_timeline_renders_a_lane_per_incarnation_and_rank(browser, tmp_path, ranks) -> None:
    page_path, tl = write_page(tmp_path, ranks)
    page, errors = load(browser, page_path)
    labels = page.locator("#timeline .yaxislayer-above .ytick text").all_text_contents()
    expected = [f"{s.lane.label(len(ranks) > 1)}" for s in tl.lanes]
    assert len(labels) == len(expected) == 2 * len(ranks)
    for label, lane in zip(labels, expected, strict=True):
        assert label.startswith(lane), (label, lane)
    assert any("killed" in label for label in labels)
    # One drawn bar per interval (2 + 3 per rank) in the "training interval" trace.
    intervals = [b for b in tl.bars if b.category == "interval"]
    assert len(intervals) == 5 * len(ranks)
    drawn = page.evaluate(
        """() => {
            const gd = document.getElementById('timeline');
            const i = gd.data.findIndex(t => t.name === 'training interval');
            const traces = gd.querySelectorAll('.barlayer .trace');
            return traces[i].querySelectorAll('.point path').length;
        }"""
    )
    assert drawn == len(intervals)
    legend = page.locator("#timeline .legend .legendtext").all_text_contents()
    for name in ("scheduler queue", "training interval", "wasted progress", "restart gap"):
        assert name in legend
    # The goodput bar above the lanes: one segment per category that took time.
    segments = page.locator("#goodput .barlayer .trace").count()
    assert segments == 1 + sum(1 for s in tl.report["badput_s"].values() if s > 0)
    assert errors == []


def test_hovering_an_interval_shows_its_span(browser, tmp_path) -> None:
    page_path, _ = write_page(tmp_path, (0,))
    page, errors = load(browser, page_path)
    index = page.evaluate(
        "() => document.getElementById('timeline').data"
        ".findIndex(t => t.name === 'training interval')"
    )
    bar = page.locator("#timeline .barlayer .trace").nth(index).locator(".point path").first
    box = bar.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector("#timeline .hoverlayer .hovertext", timeout=10_000)
    text = page.locator("#timeline .hoverlayer .hovertext").first.text_content()
    assert "megatron.train" in text and "iterations" in text
    assert errors == []


def test_the_iteration_panel_draws_each_ranks_work_and_the_hang(browser, tmp_path) -> None:
    import tracegen as g

    trace = tmp_path / "traces.jsonl"
    # a long first incarnation with a straggler, then a second one that hangs
    for rank, wait_s in ((0, 0.6), (1, 0.1)):
        first = g.with_waits(g.lifecycle(0, intervals=4, per=3), wait_s)
        g.write(trace, first, g.hung(6.25, waiting=rank == 0, start=25), rank=rank)
    out = tmp_path / "timeline.html"
    timeline.write_page(timeline.collect(span_source([trace]), [str(trace)]), out)
    page, errors = load(browser, out)
    # attached, not "visible": a flat line has no height
    page.wait_for_selector("#iterations .scatterlayer .trace", state="attached", timeout=30_000)
    assert page.locator("#iterations .scatterlayer .trace").count() == 4  # work, iteration
    # the work lines: one stretch; the iteration lines: one per incarnation
    assert page.locator("#iterations .scatterlayer .trace .js-line").count() == 2 + 2 * 2
    legend = page.locator("#iterations .legend .legendtext").all_text_contents()
    assert "rank 1 work (score 0.44 · straggler)" in legend
    title = page.locator("#iterations .gtitle").text_content()
    assert "stragglers: rank 1" in title
    hang = page.evaluate(
        "() => document.getElementById('timeline').data"
        ".filter(t => t.name === 'hang (no progress)').map(t => t.y.length)"
    )
    assert hang == [2]  # one hang bar per rank
    assert errors == []
