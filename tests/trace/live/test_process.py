"""A process's live accounting (the trainer's gauges) stays ``report``'s while it keeps
what earlier collections worked out: asked after each batch of ended spans, it gives
exactly what the batch model gives the same spans read at once, judged running as of
the moment asked (or ended as the spans say, once the run shut down)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tracegen as g

from megatron.trace.analysis.accounting import rank_accounting
from megatron.trace.analysis.liveness import mark_running
from megatron.trace.live.process import LiveProcess
from megatron.trace.model.builder import TraceBuilder
from megatron.trace.otlp.reader import iter_spans
from megatron.trace_format.semconv import STRUCTURAL_SPAN_NAMES, Category

S = 1_000_000_000


def _batch(records: list[dict], as_of_ns: int, running: bool) -> dict:
    builder = TraceBuilder()
    for record in records:
        builder.add(record)
    incs = next(iter(builder.finish().ranks.values()))
    if running:
        mark_running(incs[-1], max(as_of_ns, incs[-1].start_ns))
    found = rank_accounting(incs)
    for entry in found["per_incarnation"]:  # (the report's alone: the gauges have no use of it)
        del entry["wasted_progress_ns"]
    return found


def _records(tmp_path: Path, *incarnations: list[dict]) -> list[dict]:
    """The structural spans of one process's incarnations, as the span tally keeps them."""
    path = g.write(tmp_path / "t.jsonl", *incarnations, pid=100)
    return [r for r in iter_spans(path) if r["name"] in STRUCTURAL_SPAN_NAMES]


@pytest.mark.parametrize(
    "incarnations",
    [
        [g.lifecycle(0, intervals=4)],
        [g.lifecycle(0, intervals=3, cut_short_after=1)],
        [g.lifecycle(0, intervals=2, kill_after=1), g.lifecycle(20, load=4, first=4)],
    ],
    ids=["shutdown", "cut_short", "restarted_in_process"],
)
@pytest.mark.parametrize("step", [1, 2, 5])
def test_each_collection_is_the_batch_accounting(
    tmp_path: Path, incarnations: list[list[dict]], step: int
) -> None:
    records = _records(tmp_path, *incarnations)
    live = LiveProcess()
    assert live.accounting(0, running=True) is None
    for count in range(0, len(records), step):
        live.add(records[count : count + step])
        seen = records[: count + step]
        as_of = max(r["end_ns"] for r in seen) + S // 2  # collected half a second later
        assert live.accounting(as_of, running=True) == _batch(seen, as_of, True), count
    final = live.accounting(0, running=False)
    assert final == _batch(records, 0, False)
    totals = final["totals_ns"]
    assert sum(totals.values()) == final["wall_ns"] and totals[Category.GOODPUT] > 0


def test_the_interval_in_flight_counts_up_to_the_moment_asked(tmp_path: Path) -> None:
    """Two intervals ended (the third one open: what a SIGKILL would cut off): asked 3 s
    after the second ended and again 2 s later, the open one has trained 2 s more."""
    records = _records(tmp_path, g.lifecycle(0, intervals=2, kill_after=1))
    live = LiveProcess()
    live.add(records)
    end = max(r["end_ns"] for r in records if r["name"] == "megatron.train")
    first = live.accounting(end + 3 * S, running=True)
    later = live.accounting(end + 5 * S, running=True)
    assert first is not None and later is not None
    assert later["wall_ns"] - first["wall_ns"] == 2 * S
    assert later["totals_ns"][Category.GOODPUT] - first["totals_ns"][Category.GOODPUT] == 2 * S
