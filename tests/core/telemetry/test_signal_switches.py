"""Traces, metrics and logs switched one by one: only the enabled sink is written."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry import trace

from megatron.core.telemetry import (
    TelemetryConfig,
    TelemetryHandle,
    is_span_group_enabled,
    managed_span,
    record_training_metrics,
    setup_telemetry,
)
from megatron.trace.otlp.reader import iter_metrics, read_spans
from megatron.training.telemetry_spans import SpanPhaseError, SpanPhases

Make = Callable[..., TelemetryHandle]


def jsonl(tmp_path: Path, **kwargs: object) -> TelemetryConfig:
    return TelemetryConfig(
        enabled=True,
        exporter="jsonl",
        trace_file=tmp_path / "telemetry" / "traces.jsonl",
        run_id="switches",
        span_groups_spec="all",
        **kwargs,  # type: ignore[arg-type]
    )


def record_some(handle: TelemetryHandle) -> None:
    with managed_span("job", "a-span"):
        pass
    record_training_metrics(handle.meter, loss=1.5, step_duration_ms=10.0)


def files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "telemetry").glob("*"))


def test_traces_off_metrics_on_writes_only_metrics(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(jsonl(tmp_path, traces_enabled=False))
    assert handle.is_exporting
    assert isinstance(handle.tracer, trace.NoOpTracer)
    assert handle.trace_file is None and handle.span_groups == frozenset()
    assert not is_span_group_enabled("job")
    record_some(handle)
    handle.shutdown()
    assert files(tmp_path) == ["metrics.jsonl"]
    names = {metric["name"] for metric in iter_metrics(tmp_path / "telemetry/metrics.jsonl")}
    assert "megatron.training.loss" in names


def test_metrics_off_traces_on_writes_only_traces(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(jsonl(tmp_path, metrics_enabled=False))
    assert handle.is_exporting and handle.trace_file is not None
    record_some(handle)  # the no-op meter takes the record and drops it
    handle.shutdown()
    assert files(tmp_path) == ["traces.jsonl"]
    spans = read_spans(tmp_path / "telemetry/traces.jsonl")
    assert [span["name"] for span in spans] == ["a-span"]


def test_every_signal_off_exports_nothing(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    handle = setup_telemetry(jsonl(tmp_path, traces_enabled=False, metrics_enabled=False))
    assert not handle.is_exporting
    assert set(threading.enumerate()) - before == set()  # no thread started (one may end)
    assert list(tmp_path.iterdir()) == []


def test_lifecycle_with_traces_off_runs_and_rejects(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(jsonl(tmp_path, traces_enabled=False))
    # The gate the trainer's call sites use: with traces off, no span group is on.
    phases = SpanPhases(
        handle, save_interval=2, is_span_group_enabled=is_span_group_enabled, strict=True
    )
    assert phases.enabled is False  # no spans to open: the job group is off
    phases.start_job(model_type="GPT")
    with pytest.raises(SpanPhaseError):
        phases.step()  # a pass before start_train: startup -> interval is not in the table
    phases.start_train()
    for iteration in range(4):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    with pytest.raises(SpanPhaseError):
        phases.start_job()  # a lifecycle starts once, and ends once
    assert files(tmp_path) == ["metrics.jsonl"]
