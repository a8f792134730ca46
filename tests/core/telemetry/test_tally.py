"""The end-of-run summary: counted as the run went, never read back from the file."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry import trace

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle
from megatron.trace.otlp.reader import read_spans
from megatron.trace_format.records import SpanRecord
from megatron.training.telemetry.trace_summary import summarize

Make = Callable[..., TelemetryHandle]


def _lifecycle(handle: TelemetryHandle, t0: int) -> None:
    """Startup 2 s, one interval of 4 s with a 1 s save inside, at fixed times."""
    second = 1_000_000_000
    tracer = handle.tracer
    startup = tracer.start_span("megatron.startup", start_time=t0)
    startup.end(end_time=t0 + 2 * second)
    interval = tracer.start_span(
        "megatron.train",
        start_time=t0 + 2 * second,
        links=[trace.Link(startup.get_span_context())],
        attributes={
            "megatron.interval.index": 0,
            "megatron.interval.first_iteration": 0,
            "megatron.interval.last_iteration": 2,
        },
        context=trace.set_span_in_context(trace.INVALID_SPAN),
    )
    save = tracer.start_span(
        "megatron.checkpoint.save",
        start_time=t0 + 4 * second,
        context=trace.set_span_in_context(interval),
        attributes={"megatron.iteration": 3},
    )
    save.end(end_time=t0 + 5 * second)
    interval.end(end_time=t0 + 6 * second)
    tracer.start_span("megatron.train.iteration", start_time=t0 + 6 * second)  # left open


def test_summary_counts_this_run_and_its_goodput(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text('{"resourceSpans": [{"resou')  # a killed predecessor's torn write
    config = TelemetryConfig(enabled=True, exporter="jsonl", trace_file=path, run_id="r")
    handle = make_handle(config)
    _lifecycle(handle, time.time_ns() - 7_000_000_000)  # the open iteration ends now
    handle.shutdown()
    tally = handle.tally
    assert tally is not None

    # the tally agrees with what the shared reader reads back from the file
    spans = read_spans(path)
    assert tally.span_count == len(spans) == 4
    assert tally.cut_short == 1
    kept = {s["span_id"]: s for s in tally.kept}
    for span in spans:
        if span["span_id"] in kept:
            mine = kept[span["span_id"]]
            for key in ("name", "trace_id", "parent_id", "start_ns", "links", "attributes"):
                assert mine[key] == span[key], key

    # it never reads the file: damage written after the run changes nothing
    with path.open("a") as file:
        file.write("garbage\n" * 1000)
    text = summarize(path, tally)
    lines = text.splitlines()
    assert lines[0] == f"telemetry written to {path}"
    assert "runs (pretrain calls): 1   traces: 3   spans: 4   intervals (megatron.train): 1" in text
    # wall 7 s: startup 2, goodput 3 (the interval less its save), save 1, and the
    # cut-short iteration past the last save (1 s) is wasted progress
    (goodput,) = [line for line in lines if line.startswith("  goodput:")]
    found = re.fullmatch(
        r"  goodput: ([\d.]+) % of ([\d.]+) s wall clock;   largest badput: "
        r"startup ([\d.]+) %, (\w+) [\d.]+ %, (\w+) [\d.]+ %",
        goodput,
    )
    assert found, goodput
    assert 40 < float(found[1]) < 43.5 and 6.9 < float(found[2]) < 8
    assert 25 < float(found[3]) < 29
    assert {found[4], found[5]} == {"checkpoint_save", "wasted_progress"}
    assert "spans cut short: 1   spans with ERROR status: 1" in text
    assert "  torn lines: 1 (a killed run's last write, sealed and skipped by readers)" in lines


def test_kept_records_have_the_readers_shape(make_handle: Make, tmp_path: Path) -> None:
    """The tally and the reader build one record type: same keys, same value types."""
    path = tmp_path / "traces.jsonl"
    config = TelemetryConfig(enabled=True, exporter="jsonl", trace_file=path, run_id="r")
    handle = make_handle(config)
    _lifecycle(handle, time.time_ns() - 7_000_000_000)
    handle.shutdown()
    assert handle.tally is not None
    kept = {s["span_id"]: s for s in handle.tally.kept}
    read = {s["span_id"]: s for s in read_spans(path) if s["span_id"] in kept}
    assert len(read) == len(kept) == 4  # startup, interval, save, the cut-short iteration
    for span_id, mine in kept.items():
        theirs = read[span_id]
        assert list(mine) == list(theirs) == list(SpanRecord.__annotations__)
        for key in ("name", "trace_id", "span_id", "parent_id", "links", "link_attributes"):
            assert mine[key] == theirs[key], key
        assert (mine["status_code"], mine["kind"]) == (theirs["status_code"], theirs["kind"])
        assert mine["resource"] == theirs["resource"]
        assert (mine["file"], mine["line"]) == (None, 0)


def test_structural_snapshot_holds_the_open_interval_and_what_ended(
    make_handle: Make, tmp_path: Path
) -> None:
    handle = make_handle(
        TelemetryConfig(enabled=True, exporter="jsonl", trace_file=tmp_path / "t.jsonl")
    )
    tally = handle.tally
    startup = handle.tracer.start_span("megatron.startup", start_time=1_000)
    handle.tracer.start_span("megatron.train.iteration").end()  # not structural: not kept
    kept, still_open = tally.structural_snapshot()
    assert kept == [] and [(s["name"], s["end_ns"]) for s in still_open] == [
        ("megatron.startup", 0)
    ]
    startup.end(end_time=2_000)
    interval = handle.tracer.start_span("megatron.train", start_time=2_000)
    interval.set_attribute("megatron.interval.index", 0)
    kept, still_open = tally.structural_snapshot()
    assert [(s["name"], s["start_ns"], s["end_ns"]) for s in kept] == [
        ("megatron.startup", 1_000, 2_000)
    ]
    assert [(s["name"], s["attributes"]) for s in still_open] == [
        ("megatron.train", {"megatron.interval.index": 0})
    ]
    interval.end(end_time=3_000)
    kept, still_open = tally.structural_snapshot(since=1)  # only what came since
    assert [s["name"] for s in kept] == ["megatron.train"] and still_open == []


def _goodput_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  goodput:")]


def test_with_the_job_group_off_the_summary_says_goodput_is_not_computed(
    make_handle: Make, tmp_path: Path
) -> None:
    path = tmp_path / "traces.jsonl"
    config = TelemetryConfig(enabled=True, trace_file=path, span_groups_spec="step,checkpoint")
    handle = make_handle(config)
    second = 1_000_000_000
    save = handle.tracer.start_span("megatron.checkpoint.save", start_time=0)
    save.end(end_time=second)
    handle.shutdown()
    text = summarize(path, handle.tally, span_groups=handle.span_groups)
    (line,) = _goodput_lines(text)
    assert line.startswith("  goodput: not computed: the job span group is off")
    assert "100.0 %" not in text and "checkpoint_save" not in text.split("spans by name")[0]


def test_when_no_span_was_sampled_the_summary_says_why(
    make_handle: Make, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    path = tmp_path / "traces.jsonl"
    handle = make_handle(TelemetryConfig(enabled=True, trace_file=path))
    _lifecycle(handle, time.time_ns() - 7_000_000_000)
    handle.shutdown()
    assert handle.tally.span_count == 0
    (line,) = _goodput_lines(summarize(path, handle.tally, span_groups=handle.span_groups))
    assert line == (
        "  goodput: not computed: no span was recorded: the sampler "
        "(OTEL_TRACES_SAMPLER=always_off) kept none"
    )


def test_spans_sent_to_the_console_are_summarized_too(make_handle: Make, capsys) -> None:
    handle = make_handle(TelemetryConfig(enabled=True, exporter="console"))
    _lifecycle(handle, time.time_ns() - 7_000_000_000)
    handle.shutdown()
    capsys.readouterr()
    text = summarize(handle.trace_file, handle.tally, exporter="console")
    lines = text.splitlines()
    assert lines[0] == "telemetry exported to the console (MEGATRON_OTEL_EXPORTER=console)"
    (line,) = _goodput_lines(text)
    assert line.startswith("  goodput: ") and "wall clock" in line
