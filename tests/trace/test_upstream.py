"""Every ``megatron-trace`` subcommand on the files Megatron-LM itself writes.

The files come from ``upstream_traces``: Megatron-LM's lifecycle re-enacted
through the real OpenTelemetry SDK into the official OTLP/JSON file exporter,
with upstream's span names and attributes only (no ``megatron.interval.*``,
no iteration on the checkpoint load) and nemo-lens's resource. Each shape is
read by ``check`` (exit 0), ``report`` (the accounting), ``timeline`` (the
lanes and interval labels) and ``export`` (a complete event per span, a flow
per link), as a user would run them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chrome_helpers
import pytest

# The files are written by the official OTLP/JSON file exporter, which requires the
# newest SDK: `tox -e mindeps` (the lowest SDK we declare) skips this module.
pytest.importorskip(
    "opentelemetry.exporter.otlp.json.file",
    reason="the official OTLP/JSON file exporter (test extra) requires the newest SDK",
)

import upstream_traces as up
from upstream_traces import MS

from megatron.trace.cli.main import main
from megatron.trace.otlp.reader import read_spans
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.lanes import Lane
from megatron.trace.render.timeline import write as timeline


@dataclass
class Read:
    """What every subcommand made of the same files."""

    check_status: int
    check_lines: list[str]
    report: dict[str, Any]
    timeline: timeline.Timeline
    chrome: dict[str, Any]
    spans: list[dict[str, Any]]


def read_all(tmp_path: Path, capsys: pytest.CaptureFixture[str], *paths: Path) -> Read:
    files = list(map(str, paths))
    status = main(["check", *files])
    check_lines = capsys.readouterr().out.splitlines()
    assert main(["report", *files, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    page = tmp_path / "timeline.html"
    if importlib.util.find_spec("plotly") is not None:
        assert main(["timeline", *files, "-o", str(page)]) == 0
        assert page.stat().st_size > 0
    else:  # tox -e noextras: the page says which extra draws it (the lanes need none)
        assert main(["timeline", *files, "-o", str(page)]) == 2
        assert "pip install 'megatron-telemetry-spans[trace]'" in capsys.readouterr().err
        assert not page.exists()
    tl = timeline.collect(span_source(list(paths)), files)
    out = tmp_path / "trace.json"
    assert main(["export", *files, "--format", "chrome", "-o", str(out)]) == 0
    capsys.readouterr()
    spans = [span for path in paths for span in read_spans(path)]
    return Read(status, check_lines, report, tl, chrome_helpers.load(out), spans)


def assert_whole_export(read: Read) -> None:
    events = chrome_helpers.complete_events(read.chrome)
    assert sorted(e["args"]["span_id"] for e in events) == sorted(s["span_id"] for s in read.spans)
    by_id = {e["args"]["span_id"]: e for e in events}
    for span in read.spans:
        event = by_id[span["span_id"]]
        assert chrome_helpers.start_ns(read.chrome, event) == span["start_ns"]
        assert chrome_helpers.end_ns(read.chrome, event) == span["end_ns"]
    assert sorted(chrome_helpers.arrows(read.chrome)) == sorted(chrome_helpers.links(read.spans))


def assert_accounts_exactly(report: dict[str, Any]) -> None:
    ns = report["accounting_ns"]
    badput = sum(v for k, v in ns.items() if k not in ("wall", "goodput"))
    assert ns["goodput"] + badput == ns["wall"]


def incarnations(report: dict[str, Any]) -> list[tuple[str, int | None, int | None]]:
    return [(i["ended"], i["first_iteration"], i["last_iteration"]) for i in report["incarnations"]]


def intervals(read: Read) -> list[tuple[int, str]]:
    bars = sorted((b for b in read.timeline.bars if b.category == "interval"),
                  key=lambda b: b.start_ns)  # fmt: skip
    return [(b.lane.incarnation, b.text) for b in bars]


# -- a clean run --------------------------------------------------------------------------


@pytest.mark.parametrize("groups", ["per_step", "default"])
def test_a_clean_run_checks_and_accounts(tmp_path, capsys, groups) -> None:
    chosen = up.PER_STEP_GROUPS if groups == "per_step" else up.DEFAULT_GROUPS
    read = read_all(tmp_path, capsys, up.clean_run(tmp_path / "traces.jsonl", groups=chosen))
    assert read.check_status == 0, read.check_lines
    summary = f"ok: {len(read.spans)} spans, 1 incarnation on 1 rank, 0 violations"
    assert read.check_lines == [summary]
    report = read.report
    assert incarnations(report) == [("shutdown", 0, 29)]
    assert report["wasted_iterations"] == 0 and report["incarnations"][0]["intervals"] == 3
    # Checkpoint time: each save's exposed_save (1 + 150 + 2 ms bookkeeping and save, 1 ms
    # of its own), each pass's heartbeat and finalize (0.1 + 0.05 ms) and the exit finalize.
    assert report["accounting_ns"]["checkpoint_save"] == 3 * 154 * MS + 30 * 150_000 + MS
    assert report["accounting_ns"]["queue"] == 30_000 * MS
    assert report["accounting_ns"]["evaluation"] == 3 * 61 * MS
    # The rest of the intervals is goodput, garbage collection (megatron.train.gc_collect)
    # included: it is part of the training loop's own time.
    interval_ns = sum(
        s["end_ns"] - s["start_ns"] for s in read.spans if s["name"] == "megatron.train"
    )
    assert (
        report["accounting_ns"]["goodput"]
        == interval_ns - 3 * 154 * MS - 30 * 150_000 - MS - 3 * 61 * MS
    )
    if groups == "per_step":
        assert sum(1 for s in read.spans if s["name"] == "megatron.train.gc_collect") == 4
    assert_accounts_exactly(report)
    if groups == "per_step":
        assert report["iterations"]["count"] == 30
        assert [r.split(":")[0] for r in report["not_computed"]] == ["stragglers"]  # one rank
    else:  # without iteration spans, the ranges come from the saves and the interval length
        assert report["iterations"] is None
        assert [r.split(":")[0] for r in report["not_computed"]] == ["iterations", "stragglers"]
    assert intervals(read) == [(0, "C0 · 0–9"), (0, "C1 · 10–19"), (0, "C2 · 20–29")]
    assert [(s.lane, s.ended) for s in read.timeline.lanes] == [(Lane(0, "0"), "shutdown")]
    assert_whole_export(read)


# -- without checkpointing (save_interval 0): no interval at all -------------------------


def test_a_run_without_checkpointing_is_goodput_not_other(tmp_path, capsys) -> None:
    """With ``save_interval`` 0 upstream's loop never reroots: no ``megatron.train``, each
    iteration the root of its own trace. Its iterations (and the garbage collection, marked
    ``is_goodput_span``) are the productive time, not ``other``; and nothing is a violation."""
    read = read_all(tmp_path, capsys, up.without_checkpointing(tmp_path / "traces.jsonl"))
    assert not [s for s in read.spans if s["name"] == "megatron.train"]
    assert {s["parent_id"] for s in read.spans if s["name"] == "megatron.train.iteration"} == {None}
    assert read.check_status == 0, read.check_lines
    summary = f"ok: {len(read.spans)} spans, 1 incarnation on 1 rank, 0 violations"
    assert read.check_lines == [summary]
    report = read.report
    assert incarnations(report) == [("shutdown", 0, 29)]
    assert report["incarnations"][0]["intervals"] == 0
    ns = report["accounting_ns"]
    assert ns["goodput"] == 30 * 100 * MS + 4 * 20 * MS  # the iterations and the gc_collects
    assert ns["other"] == 0
    assert ns["evaluation"] == 3 * 61 * MS
    assert ns["checkpoint_save"] == 30 * 150_000 + MS  # heartbeats, finalizes, exit finalize
    assert report["goodput_fraction"] > 0.08  # 3.08 s of 35.2 s, 30 s of them queued
    assert report["wasted_iterations"] == 0
    assert [r.split(":")[0] for r in report["not_computed"]] == ["stragglers"]  # one rank
    assert_accounts_exactly(report)
    assert_whole_export(read)


def test_a_run_without_checkpointing_or_iteration_spans_says_goodput_is_not_computed(
    tmp_path, capsys
) -> None:
    """The default groups and no interval: nothing in the file covers the training loop, so
    its time is ``other`` and the report says why, rather than reading 0 % goodput."""
    path = up.without_checkpointing(tmp_path / "traces.jsonl", groups=up.DEFAULT_GROUPS)
    read = read_all(tmp_path, capsys, path)
    assert read.check_status == 0, read.check_lines
    report = read.report
    assert report["accounting_ns"]["goodput"] == 0
    reasons = [r for r in report["not_computed"] if r.startswith("goodput:")]
    assert len(reasons) == 1 and "megatron.train.iteration" in reasons[0], report["not_computed"]
    assert_accounts_exactly(report)


def test_a_run_without_checkpointing_killed_and_restarted_from_scratch(tmp_path, capsys) -> None:
    """Killed in iteration 25 with no checkpoint: the restart starts again at 0, so all 25
    finished iterations were re-done (wasted); the restart's 30 are goodput."""
    path = up.killed_and_restarted_without_checkpointing(tmp_path / "traces.jsonl")
    read = read_all(tmp_path, capsys, path)
    assert read.check_status == 0, read.check_lines
    report = read.report
    # Without an interval nothing in this file shows the kill (the iteration in flight had
    # finished no child), so incarnation 0 reads shutdown; the restart's horizon (iteration
    # 0) still decides what it lost.
    assert incarnations(report) == [("shutdown", 0, 24), ("shutdown", 0, 29)]
    assert report["wasted_iterations"] == 25
    ns = report["accounting_ns"]
    assert ns["wasted_progress"] == 25 * 100 * MS
    assert ns["goodput"] == 30 * 100 * MS
    assert ns["other"] == 0
    assert_accounts_exactly(report)


# -- killed and resumed -------------------------------------------------------------------

KILLED = "killed: rank 0 incarnation 0: its in-flight interval is missing (SIGKILL)"

RESTARTS = {
    "new pid": lambda path: up.killed_and_resumed(path),
    # containers: pid 1 both times, the restart on another host (lens's instance id per rank)
    "pid 1 on two hosts": up.on_two_hosts,
    "requeued in place, slurm.restart_count": up.requeued_in_place,
    "requeued in place, nvrx.cycle": lambda path: up.requeued_in_place(path, "nvrx.cycle"),
}


@pytest.mark.parametrize("shape", list(RESTARTS))
def test_killed_in_iteration_25_then_resumed_from_20(tmp_path, capsys, shape) -> None:
    read = read_all(tmp_path, capsys, RESTARTS[shape](tmp_path / "traces.jsonl"))
    assert read.check_status == 0, read.check_lines
    assert read.check_lines[0].startswith(KILLED)
    assert read.check_lines[-1].endswith(" 2 incarnations on 1 rank, 0 violations")
    report = read.report
    assert incarnations(report) == [("killed", 0, 24), ("shutdown", 20, 39)]
    assert report["wasted_iterations"] == 5
    assert report["incarnations"][0]["wasted_iterations"] == 5
    # iterations 20..24; the heartbeats and finalizes between them are checkpoint time
    assert report["accounting_ns"]["wasted_progress"] == 5 * 100 * MS
    assert [r.split(":")[0] for r in report["not_computed"]] == ["stragglers"]  # one rank
    assert_accounts_exactly(report)
    assert [(s.lane, s.ended) for s in read.timeline.lanes] == [
        (Lane(0, "0"), "killed"),
        (Lane(1, "0"), "shutdown"),
    ]
    assert intervals(read) == [
        (0, "C0 · 0–9"), (0, "C1 · 10–19"), (1, "C0 · 20–29"), (1, "C1 · 30–39")]  # fmt: skip
    assert_whole_export(read)
    assert {p for p, _ in chrome_helpers.names(read.chrome, "process_name")} == {1, 2}


def test_killed_and_resumed_with_the_default_groups(tmp_path, capsys) -> None:
    # No iteration spans and no load iteration: ranges come from the saves alone.
    path = up.killed_and_resumed(tmp_path / "traces.jsonl", groups=up.DEFAULT_GROUPS)
    read = read_all(tmp_path, capsys, path)
    assert read.check_status == 0, read.check_lines
    report = read.report
    # The resumed incarnation's first interval holds only the save at 30; its start
    # (the checkpoint load's iteration) is not in upstream's spans.
    assert incarnations(report) == [("killed", 0, 19), ("shutdown", None, 39)]
    # nor does any span say it resumed (upstream records no load): not a fresh start, but
    # from the killed one's last durable save at least, its own first save at most
    assert [inc["resumed_from"] for inc in report["incarnations"]] == [None, 20]
    resumed = report["bounds"]["incarnations.1.resumed_from"]
    assert (resumed["lower"], resumed["upper"]) == (20, 30)
    assert "the file records no load (Megatron-LM's default span groups)" in resumed["reason"]
    reasons = [reason.split(":")[0] for reason in report["not_computed"]]
    assert reasons == ["iterations", "interval iteration ranges", "stragglers"]
    assert "incarnation 1 intervals [0]" in report["not_computed"][1]
    # the killed incarnation's in-flight interval was lost: its redone iterations are a bound
    assert report["bounds"]["wasted_iterations"]["lower"] == report["wasted_iterations"]
    assert report["bounds"]["wasted_iterations"]["upper"] is None
    assert_accounts_exactly(report)
    assert intervals(read) == [
        (0, "C0 · 0–9"), (0, "C1 · 10–19"), (1, "C0 · ?–29"), (1, "C1 · 30–39")]  # fmt: skip
    assert_whole_export(read)


# -- async saves --------------------------------------------------------------------------


def test_an_async_save_whose_finalize_the_kill_lost_is_not_durable(tmp_path, capsys) -> None:
    read = read_all(tmp_path, capsys, up.async_save_lost(tmp_path / "traces.jsonl"))
    assert read.check_status == 0, read.check_lines
    report = read.report
    assert incarnations(report) == [("killed", 0, 19), ("shutdown", 10, 39)]
    assert report["wasted_iterations"] == 10
    # The finalize that completed the save at 10 (50 ms) is checkpoint time.
    finalize = [s for s in read.spans if s["name"] == "megatron.checkpoint.save.finalize"]
    assert any(s["end_ns"] - s["start_ns"] == 50 * MS for s in finalize)
    assert_accounts_exactly(report)
    assert_whole_export(read)


def test_a_final_killed_incarnation_keeps_only_its_durable_save(tmp_path, capsys) -> None:
    path = tmp_path / "traces.jsonl"
    up.Process(path, pid=4242).pretrain(
        train_iters=100, save_interval=10, async_save=True, kill=up.Kill(20, in_finalize=True)
    )
    read = read_all(tmp_path, capsys, path)
    report = read.report
    # Saves at 10 and 20; only 10's finalize ended: the progress past 10 is lost.
    saves = [s["attributes"]["megatron.iteration"] for s in read.spans
             if s["name"] == "megatron.checkpoint.save"]  # fmt: skip
    assert saves == [10, 20]
    assert incarnations(report) == [("killed", 0, 19)]
    assert report["wasted_iterations"] == 10


# -- files as collectors and log rotation leave them -------------------------------------


def test_lines_with_several_resources_and_scopes_as_a_collector_writes(tmp_path, capsys) -> None:
    scopes = ("megatron.training", "nemo.lens.helpers")
    ranks = [
        up.killed_and_resumed(tmp_path / f"rank{rank}.jsonl", rank=rank, scopes=scopes)
        for rank in (0, 1)
    ]
    merged = up.as_collector_writes(ranks, tmp_path / "collector.jsonl")
    lines = [json.loads(line) for line in merged.read_text().splitlines()]
    assert all(len(line["resourceSpans"]) == 3 for line in lines[:-1])
    assert any(len(rs["scopeSpans"]) == 2 for line in lines for rs in line["resourceSpans"])
    read = read_all(tmp_path, capsys, merged)
    assert read.check_status == 0, read.check_lines
    assert read.check_lines[-1].endswith(" 4 incarnations on 2 ranks, 0 violations")
    wasted = [(r["rank"], r["wasted_iterations"]) for r in read.report["ranks"]]
    assert wasted == [(0, 5), (1, 5)]
    assert incarnations(read.report) == [("killed", 0, 24), ("shutdown", 20, 39)]
    assert_whole_export(read)
    threads = chrome_helpers.names(read.chrome, "thread_name")
    assert sorted((pid, name) for (pid, _), name in threads.items()) == [
        (1, "rank 0"), (1, "rank 1"), (2, "rank 0"), (2, "rank 1")]  # fmt: skip


@pytest.mark.parametrize(
    "compress", ["", "gz", pytest.param("zst", marks=pytest.mark.needs_extras)]
)  # (writing the zstd piece takes zstandard)
def test_a_rotated_file_reads_as_the_original(tmp_path, capsys, compress) -> None:
    whole = up.killed_and_resumed(tmp_path / "whole.jsonl")
    expected = read_all(tmp_path, capsys, whole).report
    live = tmp_path / "traces.jsonl"
    # Rotation after the first incarnation: it lies in traces.jsonl.1[.gz|.zst].
    first = up.Process(live, pid=4242)
    first.pretrain(train_iters=100, save_interval=10, kill=up.Kill(25))
    rotated = up.rotate(live, compress)
    up.Process(live, pid=5151, clock=first.clock + 60 * up.SECOND).pretrain(
        train_iters=40, save_interval=10, start_iteration=20, load=True
    )
    assert rotated.name == "traces.jsonl.1" + (f".{compress}" if compress else "")
    read = read_all(tmp_path, capsys, rotated, live)
    assert read.check_status == 0, read.check_lines
    assert read.report["accounting_ns"] == expected["accounting_ns"]
    assert incarnations(read.report) == incarnations(expected)
    assert_whole_export(read)


@pytest.mark.needs_extras  # the zstd file is written with zstandard, then hidden from the reader
def test_a_zstd_file_without_zstandard_is_one_line_saying_what_to_install(
    tmp_path, capsys, monkeypatch
) -> None:
    path = up.clean_run(tmp_path / "traces.jsonl")
    packed = up.rotate(path, "zst")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard -> ImportError
    for command in (["check"], ["report"], ["export", "-o", str(tmp_path / "t.json")]):
        assert main([command[0], str(packed), *command[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert str(packed) in err[0] and "pip install zstandard" in err[0]
    assert not (tmp_path / "t.json").exists()


def test_a_cut_off_gzip_file_is_damage_naming_it(tmp_path, capsys) -> None:
    packed = up.rotate(up.clean_run(tmp_path / "traces.jsonl"), "gz")
    packed.write_bytes(packed.read_bytes()[:-200])
    assert main(["check", str(packed)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(packed) in err[0] and "cut off" in err[0]


def test_what_the_generator_writes_is_upstreams_shape(tmp_path) -> None:
    """The fixture itself: no attribute of ours, upstream's names, nemo-lens's resource."""
    spans = read_spans(up.killed_and_resumed(tmp_path / "traces.jsonl"))
    ours = {"megatron.interval.index", "megatron.interval.first_iteration",
            "megatron.interval.last_iteration", "megatron.interval.rerooted",
            "megatron.span.cut_short"}  # fmt: skip
    assert not ours & {key for span in spans for key in span["attributes"]}
    assert {span["resource"].get("service.instance.id") for span in spans} == {None}
    assert {tuple(sorted(span["resource"])) for span in spans} == {
        ("dl.rank", "host.name", "nemo.run.id", "process.pid", "service.name",
         "telemetry.sdk.language", "telemetry.sdk.name", "telemetry.sdk.version")}  # fmt: skip
    [load] = [s for s in spans if s["name"] == "megatron.checkpoint.load"]
    assert load["attributes"] == {"is_goodput_span": True}
    names = {span["name"] for span in spans}
    assert {"megatron.checkpoint.exposed_save", "megatron.checkpoint.save.finalize",
            "megatron.checkpoint.ft_heartbeat", "megatron.checkpoint.exit_finalize",
            "megatron.startup.arg_parse", "megatron.train.iteration"} <= names  # fmt: skip
