"""The timeline's page: our streamed bars against plotly's ``to_html`` (section
``timeline``)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from harness import Run, interleaved, synthetic_trace_file


def bench_timeline_page(repeats: int) -> tuple[float, float, float, int]:
    """The timeline's lanes into their page: ours (the bars streamed through temporary
    columns into plotly's markup, msgspec encoding them) against plotly's own
    ``to_html`` of the whole figure, interleaved, each from the same read of a
    generated file with an interval every 4 iterations (the bars of every interval and
    save: what makes a big page). Returns (ratio, ours s, plotly s, bars)."""
    from megatron.trace.otlp.spans import span_source
    from megatron.trace.render.timeline.data import collect
    from megatron.trace.render.timeline.page import figure, lanes_plot, piece_bytes

    with tempfile.TemporaryDirectory(prefix="bench-page-") as directory:
        path, _, _ = synthetic_trace_file(
            Path(directory), "traces.jsonl", spans=400_000, save_interval=4
        )
        timeline = collect(span_source([path]), [str(path)], jobs=1)
    config = {"displaylogo": False}

    def ours() -> float:
        start = time.perf_counter()
        for _ in piece_bytes(lanes_plot(timeline, "timeline", config)):
            pass
        return time.perf_counter() - start

    def plotly() -> float:
        start = time.perf_counter()
        figure(timeline).to_html(
            full_html=False, include_plotlyjs=False, div_id="timeline", config=config
        )
        return time.perf_counter() - start

    return (*interleaved(ours, plotly, repeats), sum(1 for _ in timeline.bars))


def section_timeline(run: Run) -> None:
    ratio, ours, plotly, bars = bench_timeline_page(3 if run.quick else 9)
    run.record(
        "timeline_page_ratio_vs_plotly",
        ratio,
        f"{ours * 1e3:.0f} ms, {bars} bars",
        f"plotly's to_html: {plotly * 1e3:.0f} ms",
    )
