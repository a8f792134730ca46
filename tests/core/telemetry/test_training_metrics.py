from __future__ import annotations

import gc
import logging
import warnings
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum

from megatron.core.telemetry import training_metrics as tm
from megatron.core.telemetry.training_metrics import record_training_metrics

with warnings.catch_warnings():
    # torch without numpy warns on import; irrelevant here.
    warnings.simplefilter("ignore", UserWarning)
    import torch


class _Instrument:
    def __init__(self, kind: str, kwargs: dict[str, Any]) -> None:
        self.kind = kind
        self.kwargs = kwargs
        self.calls: list[tuple[str, Any]] = []

    def record(self, value: Any) -> None:
        self.calls.append(("record", value))

    def set(self, value: Any) -> None:
        self.calls.append(("set", value))

    def add(self, value: Any) -> None:
        self.calls.append(("add", value))


class _FakeMeter:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.created: dict[str, _Instrument] = {}
        self.factory_calls = 0

    def _make(self, kind: str, **kwargs: Any) -> _Instrument:
        self.factory_calls += 1
        if self.fail:
            raise RuntimeError("meter broken")
        instrument = _Instrument(kind, kwargs)
        self.created[kwargs["name"]] = instrument
        return instrument

    def create_histogram(self, **kwargs: Any) -> _Instrument:
        return self._make("histogram", **kwargs)

    def create_counter(self, **kwargs: Any) -> _Instrument:
        return self._make("counter", **kwargs)

    def create_gauge(self, **kwargs: Any) -> _Instrument:
        return self._make("gauge", **kwargs)


NAMES = {
    "MEGATRON_TRAINING_STEP_DURATION_MS": "megatron.training.step_duration_ms",
    "MEGATRON_TRAINING_LOSS": "megatron.training.loss",
    "MEGATRON_TRAINING_THROUGHPUT_TFLOPS": "megatron.training.throughput_tflops",
    "MEGATRON_TRAINING_GRAD_NORM": "megatron.training.grad_norm",
    "MEGATRON_TRAINING_SKIPPED_ITERS": "megatron.training.skipped_iters",
    "MEGATRON_TRAINING_LEARNING_RATE": "megatron.training.learning_rate",
    "MEGATRON_TRAINING_TOKENS_PER_SEC": "megatron.training.tokens_per_sec",
    "MEGATRON_TRAINING_MEMORY_ALLOCATED_GB": "megatron.training.memory_allocated_gb",
}


def test_metric_name_constants() -> None:
    for constant, name in NAMES.items():
        assert getattr(tm, constant) == name


def test_all_instruments_created_on_first_use_with_their_kinds() -> None:
    meter = _FakeMeter()
    record_training_metrics(meter, loss=1.0)
    assert set(meter.created) == set(NAMES.values())
    kinds = {name: instrument.kind for name, instrument in meter.created.items()}
    assert kinds.pop(tm.MEGATRON_TRAINING_STEP_DURATION_MS) == "histogram"
    assert kinds.pop(tm.MEGATRON_TRAINING_SKIPPED_ITERS) == "counter"
    assert set(kinds.values()) == {"gauge"}
    step = meter.created[tm.MEGATRON_TRAINING_STEP_DURATION_MS]
    assert step.kwargs["unit"] == "ms"
    for instrument in meter.created.values():
        assert set(instrument.kwargs) == {"name", "unit", "description"}
        assert instrument.kwargs["description"]


def test_instruments_created_once_per_meter() -> None:
    meter, other = _FakeMeter(), _FakeMeter()
    record_training_metrics(meter, loss=1.0)
    record_training_metrics(meter, loss=2.0)
    record_training_metrics(other, loss=3.0)
    assert meter.factory_calls == 8
    assert other.factory_calls == 8
    assert meter.created[tm.MEGATRON_TRAINING_LOSS].calls == [("set", 1.0), ("set", 2.0)]


def test_cache_is_weak() -> None:
    meter = _FakeMeter()
    record_training_metrics(meter, loss=1.0)
    assert meter in tm._TRAINING_INSTRUMENTS
    before = len(tm._TRAINING_INSTRUMENTS)
    del meter
    gc.collect()
    assert len(tm._TRAINING_INSTRUMENTS) == before - 1


def test_factory_failure_is_logged_not_raised_and_nothing_cached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meter = _FakeMeter(fail=True)
    with caplog.at_level(logging.WARNING, logger=tm.__name__):
        record_training_metrics(meter, loss=1.0, step_duration_ms=3.0)
    assert "Failed to create training metric instruments" in caplog.text
    assert meter not in tm._TRAINING_INSTRUMENTS
    # a meter that recovers gets its instruments on the next call
    meter.fail = False
    record_training_metrics(meter, loss=1.0)
    assert meter.created[tm.MEGATRON_TRAINING_LOSS].calls == [("set", 1.0)]


def test_values_are_routed_and_coerced() -> None:
    meter = _FakeMeter()
    record_training_metrics(
        meter,
        step_duration_ms=120,
        loss=torch.tensor(2.5),
        throughput_tflops=0.0,
        grad_norm=torch.tensor(1.5, dtype=torch.float64),
        learning_rate=1e-4,
        tokens_per_sec=1000,
        memory_allocated_gb=0,
    )
    created = meter.created
    assert created[tm.MEGATRON_TRAINING_STEP_DURATION_MS].calls == [("record", 120.0)]
    grad_norm = created[tm.MEGATRON_TRAINING_GRAD_NORM].calls
    assert grad_norm == [("set", 1.5)]
    assert type(grad_norm[0][1]) is float
    assert created[tm.MEGATRON_TRAINING_LOSS].calls == [("set", 2.5)]
    # zero is a value, recorded for non-counter metrics
    assert created[tm.MEGATRON_TRAINING_THROUGHPUT_TFLOPS].calls == [("set", 0.0)]
    assert created[tm.MEGATRON_TRAINING_MEMORY_ALLOCATED_GB].calls == [("set", 0.0)]
    assert created[tm.MEGATRON_TRAINING_LEARNING_RATE].calls == [("set", 1e-4)]
    assert created[tm.MEGATRON_TRAINING_TOKENS_PER_SEC].calls == [("set", 1000.0)]
    # None means unknown: nothing recorded
    assert created[tm.MEGATRON_TRAINING_SKIPPED_ITERS].calls == []


def test_skipped_iters_only_positive_values_are_added() -> None:
    meter = _FakeMeter()
    for value in (0, 2, -1, 1):
        record_training_metrics(meter, skipped_iters=value)
    assert meter.created[tm.MEGATRON_TRAINING_SKIPPED_ITERS].calls == [("add", 2), ("add", 1)]


def test_one_bad_value_does_not_cost_the_others(caplog: pytest.LogCaptureFixture) -> None:
    meter = _FakeMeter()
    record_training_metrics(meter, loss="not a number", grad_norm=3.0)
    assert meter.created[tm.MEGATRON_TRAINING_LOSS].calls == []
    assert meter.created[tm.MEGATRON_TRAINING_GRAD_NORM].calls == [("set", 3.0)]
    assert "Failed to record training metrics" in caplog.text


def test_without_opentelemetry_nothing_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tm, "metrics", None)
    meter = _FakeMeter()
    record_training_metrics(meter, loss=1.0)
    assert meter.factory_calls == 0
    assert meter not in tm._TRAINING_INSTRUMENTS


def test_end_to_end_with_a_real_meter_provider() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("test")
    record_training_metrics(
        meter,
        step_duration_ms=100.0,
        loss=3.0,
        throughput_tflops=50.0,
        grad_norm=torch.tensor(0.75),
        skipped_iters=0,
        learning_rate=0.01,
        tokens_per_sec=2048.0,
        memory_allocated_gb=1.25,
    )
    record_training_metrics(meter, step_duration_ms=300.0, loss=2.0, skipped_iters=2)
    data = reader.get_metrics_data()
    provider.shutdown()
    found = {
        metric.name: metric.data
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    step = found[tm.MEGATRON_TRAINING_STEP_DURATION_MS]
    assert isinstance(step, Histogram)
    (point,) = step.data_points
    assert (point.count, point.sum, point.min, point.max) == (2, 400.0, 100.0, 300.0)
    skipped = found[tm.MEGATRON_TRAINING_SKIPPED_ITERS]
    assert isinstance(skipped, Sum) and skipped.is_monotonic
    assert skipped.data_points[0].value == 2
    expected_gauges = {
        tm.MEGATRON_TRAINING_LOSS: 2.0,
        tm.MEGATRON_TRAINING_THROUGHPUT_TFLOPS: 50.0,
        tm.MEGATRON_TRAINING_GRAD_NORM: 0.75,
        tm.MEGATRON_TRAINING_LEARNING_RATE: 0.01,
        tm.MEGATRON_TRAINING_TOKENS_PER_SEC: 2048.0,
        tm.MEGATRON_TRAINING_MEMORY_ALLOCATED_GB: 1.25,
    }
    for name, value in expected_gauges.items():
        assert isinstance(found[name], Gauge), name
        assert found[name].data_points[0].value == value
