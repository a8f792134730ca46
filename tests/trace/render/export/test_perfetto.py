"""``megatron-trace export --format perfetto`` and the window both formats share.

Each span must come back, from the protobuf alone, as one slice on its lane's
track with its exact nanosecond times, its attributes and ids, nested under
its parent even where timestamps tie; each link as a flow; the window and the
ranks must keep exactly the spans they name.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import chrome_helpers
import pytest
import synthetic
from perfetto_reading import clock_snapshots, read_slices
from pictures_helpers import T0, S, Span, incarnation, resource, run_command, write_trace

from megatron.trace.otlp.reader import read_spans
from megatron.trace.render.export import write as export
from megatron.trace.render.export.perfetto import varint, varints


def _perfetto(tmp_path: Path, *traces: Path, extra: tuple[str, ...] = ()) -> Path:
    out = tmp_path / "trace.pftrace"
    argv = [*map(str, traces), "--format", "perfetto", "-o", str(out), *extra]
    assert run_command(export, argv) == 0
    return out


def _tied_job(tmp_path: Path) -> tuple[Path, list[Span]]:
    """Two ranks; phases that tile, children that start or end with their parents, a
    queue span that ends where the startup begins, a zero-length span between two phases."""
    processes = []
    spans_of_all = []
    for rank in (0, 1):
        first = incarnation(0, 0, 2, queue=5)
        startup = next(s for s in first if s.name == "megatron.startup")
        # imports starts at the startup's own nanosecond and model_init where it ends; a
        # zero-length child of the startup sits at that boundary, written first
        first.insert(0, startup.child("megatron.startup.marker", 1, 1))
        second = incarnation(30, 8, 1)
        processes += [
            (resource("job", rank, 100 + rank), first),
            (resource("job", rank, 200 + rank), second),
        ]
        spans_of_all += first + second
    return write_trace(tmp_path / "traces.jsonl", processes), spans_of_all


def test_every_span_is_one_slice_on_its_lane_nested_under_its_parent(tmp_path: Path) -> None:
    path, spans = _tied_job(tmp_path)
    slices, lanes = read_slices(_perfetto(tmp_path, path))
    assert sorted(lanes.values()) == [f"incarnation {i}/rank {r}" for i in (0, 1) for r in (0, 1)]
    assert len(slices) == len(spans)
    by_id = {s.args["span_id"]: s for s in slices}
    for span in spans:
        found = by_id[span.span_id]
        incarnation_index = 0 if span.start < 30 else 1
        assert found.name == span.name
        assert found.track.startswith(f"incarnation {incarnation_index}/")
        assert (found.ts, found.dur) == (
            T0 + round(span.start * S),
            round((span.end - span.start) * S),
        )
        assert found.args["trace_id"] == span.trace_id
        for key, value in span.attributes.items():
            assert found.args[key] == value
        parent = found.parent.args["span_id"] if found.parent else None
        assert parent == (span.parent.span_id if span.parent else None), span.name


def test_times_are_the_spans_epoch_nanoseconds_with_no_clock_of_their_own(
    tmp_path: Path,
) -> None:
    """Epoch nanoseconds are what Perfetto UI's "Realtime (UTC)" format shows as they are;
    a clock snapshot would only add a track of its own."""
    path, spans = _tied_job(tmp_path)
    out = _perfetto(tmp_path, path)
    assert clock_snapshots(out) == []
    first = T0 + int(min(span.start for span in spans) * S)
    assert min(s.ts for s in read_slices(out)[0]) == first


def test_links_are_flows_with_both_ends(tmp_path: Path) -> None:
    path, spans = _tied_job(tmp_path)
    slices, _ = read_slices(_perfetto(tmp_path, path))
    ends = Counter(flow for s in slices for flow in s.flows)
    links = [(span, target) for span in spans for target in span.links]
    assert len(ends) == len(links) and set(ends.values()) == {2}
    by_id = {s.args["span_id"]: s for s in slices}
    for span, target in links:
        assert set(by_id[span.span_id].flows) & set(by_id[target.span_id].flows)


def test_a_synthetic_job_reads_back_whole(tmp_path: Path) -> None:
    shape = synthetic.Shape(spans=5000, ranks=2, save_interval=11, incarnations=2)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    slices, _ = read_slices(_perfetto(tmp_path, path))
    spans = read_spans(path)
    assert len(slices) == len(spans)
    assert Counter((s.name, s.ts, s.dur) for s in slices) == Counter(
        (s["name"], s["start_ns"], s["end_ns"] - s["start_ns"]) for s in spans
    )
    assert max(s.depth for s in slices) == 3  # interval > iteration > forward_backward > get_batch


def test_parallel_parts_give_the_same_slices(tmp_path: Path) -> None:
    shape = synthetic.Shape(spans=4000, ranks=3, save_interval=9, per_rank_files=True)
    files = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    one = tmp_path / "one.pftrace"
    many = tmp_path / "many.pftrace"
    export.export_files(files, one, "perfetto", jobs=1)
    export.export_files(files, many, "perfetto", jobs=3)

    def key(s):
        return (s.track, s.name, s.ts, s.dur, s.depth)

    assert sorted(map(key, read_slices(one)[0])) == sorted(map(key, read_slices(many)[0]))
    chrome_one, chrome_many = tmp_path / "one.json", tmp_path / "many.json"
    export.export_files(files, chrome_one, "chrome", jobs=1)
    export.export_files(files, chrome_many, "chrome", jobs=3)

    def events(p):
        return sorted(
            json.dumps(e, sort_keys=True) for e in json.loads(p.read_text())["traceEvents"]
        )

    assert events(chrome_one) == events(chrome_many)


@pytest.mark.parametrize("fmt", ["chrome", "perfetto"])
def test_ranks_and_a_wall_clock_window_keep_the_overlapping_spans(tmp_path: Path, fmt: str) -> None:
    path, spans = _tied_job(tmp_path)
    since, until = T0 + 4 * S, T0 + 9 * S
    out = tmp_path / f"cut.{fmt}"
    window = ["--since", "+9s", "--until", "+14s", "--ranks", "1"]  # the trace starts at -5 s
    assert run_command(export, [str(path), "--format", fmt, "-o", str(out), *window]) == 0
    kept = [
        s
        for s in read_spans(path)
        if s["resource"]["dl.rank"] == 1 and s["end_ns"] >= since and s["start_ns"] <= until
    ]
    if fmt == "perfetto":
        got = Counter((s.name, s.ts) for s in read_slices(out)[0])
    else:
        document = chrome_helpers.load(out)
        got = Counter(
            (e["name"], chrome_helpers.start_ns(document, e))
            for e in chrome_helpers.complete_events(document)
        )
    assert got == Counter((s["name"], s["start_ns"]) for s in kept)
    assert 0 < len(kept) < len(spans) / 2


def test_an_iteration_window_starts_and_ends_at_those_iterations(tmp_path: Path) -> None:
    path, _ = _tied_job(tmp_path)
    out = tmp_path / "it.pftrace"
    argv = [
        str(path),
        "--format",
        "perfetto",
        "-o",
        str(out),
        "--since",
        "iteration:2",
        "--until",
        "iteration:3",
    ]
    assert run_command(export, argv) == 0
    iterations = sorted(
        s.args["megatron.iteration"]
        for s in read_slices(out)[0]
        if s.name == "megatron.train.iteration"
    )
    # on both ranks; iteration 1 ends where 2 starts, so it touches the window's start,
    # while iteration 4 starts after the evaluation and save that follow 3
    assert iterations == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--since", "yesterday"], "--since: 'yesterday' is not a time: give an ISO 8601 time"),
        (["--until", "iteration:99"], "--until: iteration 99 is not in the trace"),
        (["--ranks", "7"], "--ranks: no rank 7 in the trace (its ranks: 0, 1)"),
        (["--since", "+10s", "--until", "+5s"], "--until (+5s) is before --since (+10s)"),
    ],
)
def test_a_window_that_names_nothing_is_one_error_line(tmp_path, capsys, flags, message) -> None:
    path, _ = _tied_job(tmp_path)
    out = tmp_path / "cut.pftrace"
    assert run_command(export, [str(path), "--format", "perfetto", "-o", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"megatron-trace export: error: {message}")
    assert not out.exists() and list(tmp_path.glob(".*.tmp*")) == []


def test_an_export_too_big_for_a_tab_says_so_and_suggests_a_cut(
    tmp_path, capsys, monkeypatch
) -> None:
    path, _ = _tied_job(tmp_path)
    monkeypatch.setitem(export.SIZE_LIMITS, "perfetto", 2000)
    out = _perfetto(tmp_path, path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"megatron-trace export: warning: {out} is ")
    assert "Perfetto UI loads about" in err[0] and "--until +" in err[0] and "--ranks 0" in err[0]
    size = out.stat().st_size  # the suggestion is a cut that fits
    suggested = err[0].split("--until ")[1].split()[0]
    out2 = tmp_path / "fits.pftrace"
    assert (
        run_command(
            export, [str(path), "--format", "perfetto", "-o", str(out2), "--until", suggested]
        )
        == 0
    )
    assert out2.stat().st_size < size


def test_varints_are_protobufs() -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    values = [0, 1, 127, 128, 16383, 16384, 2**56 - 1, 2**56, T0, 2**63 - 1, 2**63, 2**64 - 1]
    assert [varint(v) for v in values] == [_VarintBytes(v) for v in values]
    assert varint(-3) == _VarintBytes(2**64 - 3)
    times = [T0 + 37 * n for n in range(100)]
    assert varints(times) == [_VarintBytes(t) for t in times]
