"""The heartbeat gauge: 1 in every metrics export while the handle is up, 0 in the last one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle
from megatron.core.telemetry.heartbeat import (
    HEARTBEAT_METRIC,
    HEARTBEAT_PERIOD_S,
    STALE_AFTER_S,
    register_heartbeat,
)
from megatron.core.telemetry.setup import JSONL_METRIC_EXPORT_INTERVAL_MILLIS
from megatron.trace.otlp.reader import iter_metrics

Make = Callable[..., TelemetryHandle]


def _points(reader: InMemoryMetricReader) -> list[tuple[int, int]]:
    data = reader.get_metrics_data()
    return [
        (point.value, point.time_unix_nano)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == HEARTBEAT_METRIC
        for point in metric.data.data_points
    ]


def test_heartbeat_beats_at_every_collection_while_up(make_handle: Make) -> None:
    reader = InMemoryMetricReader()
    handle = make_handle(TelemetryConfig(enabled=True, exporter="none"), metric_reader=reader)
    ((first, t1),) = _points(reader)
    ((second, t2),) = _points(reader)
    assert (first, second) == (1, 1)
    assert t2 > t1  # each point carries its collection time: what a reader judges age by
    handle.shutdown()


def test_the_export_at_shutdown_says_zero(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "telemetry" / "traces.jsonl"
    handle = make_handle(TelemetryConfig(enabled=True, exporter="jsonl", trace_file=path))
    assert not handle.is_shut_down
    handle.shutdown()
    assert handle.is_shut_down
    beats = [
        point
        for metric in iter_metrics(path.with_name("metrics.jsonl"))
        if metric["name"] == HEARTBEAT_METRIC
        for point in metric["data"]["gauge"]["dataPoints"]
    ]
    assert [point["asInt"] for point in beats] == ["0"]  # the only export: the one at shutdown
    assert int(beats[0]["timeUnixNano"]) > 0


def test_no_heartbeat_without_metrics(make_handle: Make, tmp_path: Path) -> None:
    path = tmp_path / "telemetry" / "traces.jsonl"
    handle = make_handle(
        TelemetryConfig(enabled=True, exporter="jsonl", trace_file=path, metrics_enabled=False)
    )
    handle.shutdown()
    assert not path.with_name("metrics.jsonl").exists()


def test_the_staleness_bound_is_three_export_periods() -> None:
    assert JSONL_METRIC_EXPORT_INTERVAL_MILLIS == HEARTBEAT_PERIOD_S * 1000
    assert STALE_AFTER_S == 3 * HEARTBEAT_PERIOD_S


def test_a_meter_that_cannot_make_the_gauge_is_logged_not_raised(caplog) -> None:
    class Broken:
        def create_observable_gauge(self, *args, **kwargs):
            raise RuntimeError("no gauges here")

    register_heartbeat(Broken(), lambda: True)
    assert "heartbeat" in caplog.text
