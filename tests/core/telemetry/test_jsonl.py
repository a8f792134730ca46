from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from core_telemetry_helpers import spans_by_name
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from megatron.core.telemetry import (
    CUT_SHORT_ATTRIBUTE,
    TelemetryConfig,
    TelemetryHandle,
    managed_span,
    record_training_metrics,
)
from megatron.core.telemetry import training_metrics as tm
from megatron.core.telemetry.heartbeat import HEARTBEAT_METRIC
from megatron.core.telemetry.jsonl import JsonlFile, metrics_file_for
from megatron.trace.otlp.reader import ReadStats, iter_metrics, iter_spans

Make = Callable[..., TelemetryHandle]

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
SPAN_ID = re.compile(r"^[0-9a-f]{16}$")
DECIMAL = re.compile(r"^[0-9]+$")


def jsonl_config(path: Path, run_id: str = "run") -> TelemetryConfig:
    return TelemetryConfig(
        enabled=True, exporter="jsonl", trace_file=path, run_id=run_id, span_groups_spec="all"
    )


def run_session(make_handle: Make, path: Path, run_id: str, names: tuple[str, ...]) -> None:
    handle = make_handle(jsonl_config(path, run_id))
    for name in names:
        with managed_span("job", name), managed_span("step", f"{name}.child"):
            pass
    handle.shutdown()


def test_lines_are_otlp_json(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "telemetry" / "traces.jsonl"
    handle = make_handle(jsonl_config(path, "run-format"))
    values = {
        "text": "héllo",
        "flag": False,
        "count": 2**40,
        "ratio": 0.25,
        "names": ["a", "b"],
        "floats": [1.5, 2.5],
    }
    with managed_span("job", "root", **values) as root:
        root.add_event("checkpoint-saved", {"iteration": 10})
        with managed_span("step", "child") as child:
            with managed_span("layer", "grandchild"):
                pass
            child.set_attribute("nan", math.nan)
    linked = handle.tracer.start_span(
        "linked",
        kind=SpanKind.CLIENT,
        links=[Link(root.get_span_context(), {"why": "previous interval"})],
        context=trace.set_span_in_context(trace.INVALID_SPAN),
    )
    linked.end()
    with pytest.raises(ValueError), managed_span("job", "failed"):
        raise ValueError("bad batch")
    handle.shutdown()

    lines = path.read_text().splitlines()
    requests = [json.loads(line) for line in lines]
    for request in requests:
        assert set(request) == {"resourceSpans"}
        for resource_spans in request["resourceSpans"]:
            assert set(resource_spans) >= {"resource", "scopeSpans"}
            for scope_spans in resource_spans["scopeSpans"]:
                assert scope_spans["scope"]["name"] == "megatron"
    raw = {
        span["name"]: span
        for request in requests
        for resource_spans in request["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    }
    assert set(raw) == {"root", "child", "grandchild", "linked", "failed"}
    for span in raw.values():
        assert TRACE_ID.match(span["traceId"])
        assert SPAN_ID.match(span["spanId"])
        # A default value is omitted (protobuf JSON mapping): a root has no parentSpanId.
        assert "parentSpanId" not in span or SPAN_ID.match(span["parentSpanId"])
        assert DECIMAL.match(span["startTimeUnixNano"])
        assert DECIMAL.match(span["endTimeUnixNano"])
    count = next(kv for kv in raw["root"]["attributes"] if kv["key"] == "count")
    assert count["value"] == {"intValue": str(2**40)}, "int64 values must be JSON strings"
    assert raw["child"]["attributes"] == [{"key": "nan", "value": {"doubleValue": "NaN"}}]
    assert DECIMAL.match(raw["root"]["events"][0]["timeUnixNano"])
    assert raw["root"]["kind"] == 1  # INTERNAL on the wire
    assert raw["linked"]["kind"] == 3  # CLIENT

    # the same file through the shared reader
    spans = {span["name"]: span for span in iter_spans(path)}
    for span in spans.values():
        assert span["start_ns"] <= span["end_ns"]
        assert span["resource"]["megatron.run_id"] == "run-format"
        assert span["file"] == path
    root, child, grandchild = spans["root"], spans["child"], spans["grandchild"]
    assert "parentSpanId" not in raw["root"]
    assert raw["root"]["status"] == {}  # UNSET: code 0 is the default, so omitted
    assert root["parent_id"] is None
    assert child["parent_id"] == root["span_id"]
    assert grandchild["parent_id"] == child["span_id"]
    assert root["trace_id"] == child["trace_id"] == grandchild["trace_id"]
    assert root["attributes"] == values
    assert math.isnan(child["attributes"]["nan"])
    (event,) = root["events"]
    assert event["name"] == "checkpoint-saved"
    assert event["attributes"] == {"iteration": 10}
    linked = spans["linked"]
    assert linked["links"] == [(root["trace_id"], root["span_id"])]
    assert linked["link_attributes"] == [{"why": "previous interval"}]
    assert linked["trace_id"] != root["trace_id"]
    assert root["status_code"] == "UNSET"
    failed = spans["failed"]
    assert (failed["status_code"], failed["status_message"]) == ("ERROR", "ValueError: bad batch")
    assert [e["name"] for e in failed["events"]] == ["exception"]


def test_second_run_appends_and_keeps_first_run_bytes(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    run_session(make_handle, path, "first", ("a", "b"))
    first_bytes = path.read_bytes()
    assert first_bytes.endswith(b"\n")
    run_session(make_handle, path, "second", ("c",))
    content = path.read_bytes()
    assert content.startswith(first_bytes)
    assert len(content) > len(first_bytes)
    runs = {span["name"]: span["resource"]["megatron.run_id"] for span in iter_spans(path)}
    assert runs == {
        "a": "first",
        "a.child": "first",
        "b": "first",
        "b.child": "first",
        "c": "second",
        "c.child": "second",
    }


def test_appending_after_a_torn_last_line(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    run_session(make_handle, path, "killed", ("a",))
    torn = b'{"resourceSpans":[{"resource":{"attri'
    with path.open("ab") as file:
        file.write(torn)
    before = path.read_bytes()
    run_session(make_handle, path, "resumed", ("b",))
    content = path.read_bytes()
    assert content.startswith(before + b"\n")
    lines = content.decode().splitlines()
    assert lines.count(torn.decode()) == 1
    stats = ReadStats()
    names = {span["name"] for span in iter_spans(path, stats)}
    assert names == {"a", "a.child", "b", "b.child"}
    # the torn line is in the middle of the file now: skipped and reported by number
    assert [t.line for t in stats.torn] == [lines.index(torn.decode()) + 1]


def test_span_open_at_shutdown_is_exported_and_marked(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    handle = make_handle(jsonl_config(path))
    scope = managed_span("job", "interval")
    interval = scope.__enter__()
    with managed_span("step", "finished-iteration"):
        pass
    iteration = handle.tracer.start_span("iteration-in-flight")
    handle.shutdown()
    scope.__exit__(None, None, None)  # the owner ends it late: a no-op now

    spans = spans_by_name(path)
    assert set(spans) == {"interval", "finished-iteration", "iteration-in-flight"}
    for name in ("interval", "iteration-in-flight"):
        span = spans[name]
        assert span["attributes"][CUT_SHORT_ATTRIBUTE] is True
        assert span["status_code"] == "ERROR"
        assert span["status_message"] == "span still open at telemetry shutdown"
        assert span["end_ns"] >= span["start_ns"]
    finished = spans["finished-iteration"]
    assert CUT_SHORT_ATTRIBUTE not in finished["attributes"]
    assert finished["status_code"] == "UNSET"
    # innermost first: the in-flight iteration ended no later than its interval
    assert spans["iteration-in-flight"]["end_ns"] <= spans["interval"]["end_ns"]
    assert not interval.is_recording()
    assert not iteration.is_recording()


def test_metrics_jsonl_gets_training_metrics(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "telemetry" / "traces.jsonl"
    handle = make_handle(jsonl_config(path))
    record_training_metrics(
        handle.meter,
        step_duration_ms=250.0,
        loss=2.0,
        throughput_tflops=1.5,
        grad_norm=0.5,
        skipped_iters=3,
        learning_rate=0.001,
        tokens_per_sec=4096,
        memory_allocated_gb=0.0,
    )
    handle.shutdown()
    metrics_path = tmp_path / "telemetry" / "metrics.jsonl"
    assert metrics_file_for(path) == metrics_path
    found = {metric["name"]: metric["data"] for metric in iter_metrics(metrics_path)}
    assert set(found) == {
        tm.MEGATRON_TRAINING_STEP_DURATION_MS,
        tm.MEGATRON_TRAINING_LOSS,
        tm.MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
        tm.MEGATRON_TRAINING_GRAD_NORM,
        tm.MEGATRON_TRAINING_SKIPPED_ITERS,
        tm.MEGATRON_TRAINING_LEARNING_RATE,
        tm.MEGATRON_TRAINING_TOKENS_PER_SEC,
        tm.MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
        HEARTBEAT_METRIC,
    }
    (step,) = found[tm.MEGATRON_TRAINING_STEP_DURATION_MS]["histogram"]["dataPoints"]
    assert step["count"] == "1" and step["sum"] == 250.0
    assert all(DECIMAL.match(count) for count in step["bucketCounts"])
    assert found[tm.MEGATRON_TRAINING_STEP_DURATION_MS]["unit"] == "ms"
    skipped = found[tm.MEGATRON_TRAINING_SKIPPED_ITERS]["sum"]
    assert skipped["isMonotonic"] is True
    assert skipped["aggregationTemporality"] == 2  # cumulative
    assert skipped["dataPoints"][0]["asInt"] == "3"
    gauge_points = {
        name: metric["gauge"]["dataPoints"][0]
        for name, metric in found.items()
        if "gauge" in metric
    }
    assert gauge_points[tm.MEGATRON_TRAINING_LOSS]["asDouble"] == 2.0
    assert gauge_points[tm.MEGATRON_TRAINING_MEMORY_ALLOCATED_GB]["asDouble"] == 0.0
    for point in gauge_points.values():
        assert DECIMAL.match(point["timeUnixNano"])


def test_metrics_file_never_collides_with_the_trace_file(tmp_path: Path) -> None:
    assert metrics_file_for(tmp_path / "metrics.jsonl") == tmp_path / "metrics.metrics.jsonl"


def test_jsonl_file_writes_whole_lines_and_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.jsonl"
    file = JsonlFile.open(path)
    assert file.write_lines([{"x": 1}, {"y": "é"}]) is True
    assert path.read_text(encoding="utf-8") == '{"x":1}\n{"y":"é"}\n'
    file.close()
    assert file.write_lines([{"z": 1}]) is False
    assert path.read_text(encoding="utf-8") == '{"x":1}\n{"y":"é"}\n'


def test_jsonl_file_rejects_non_json_values(tmp_path: Path) -> None:
    file = JsonlFile.open(tmp_path / "out.jsonl")
    with pytest.raises(ValueError):
        file.write_lines([{"x": math.inf}])
    file.close()
    assert (tmp_path / "out.jsonl").read_bytes() == b""


def test_discard_removes_only_what_open_created(tmp_path: Path) -> None:
    existing = tmp_path / "keep.jsonl"
    existing.write_text("")
    JsonlFile.open(existing).discard()
    assert existing.exists()
    fresh = JsonlFile.open(tmp_path / "new" / "dir" / "t.jsonl")
    fresh.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]
