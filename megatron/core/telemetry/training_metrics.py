"""The per-iteration training metrics and how they are recorded.

The names are :mod:`megatron.trace_format.semconv`'s (re-exported here), so a
dashboard, a test and the trainer agree on them.
Instruments are created once per meter and cached in a weak-keyed map: a
meter that goes away (its handle shut down, a test's provider collected)
takes its instruments with it, and a second handle in the same process gets
fresh instruments from its own meter.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any

try:
    from opentelemetry import metrics
except ImportError:  # pragma: no cover - exercised only without opentelemetry
    metrics = None  # type: ignore[assignment]

from megatron.trace_format.semconv import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)

__all__ = [
    "MEGATRON_TRAINING_GRAD_NORM",
    "MEGATRON_TRAINING_LEARNING_RATE",
    "MEGATRON_TRAINING_LOSS",
    "MEGATRON_TRAINING_MEMORY_ALLOCATED_GB",
    "MEGATRON_TRAINING_SKIPPED_ITERS",
    "MEGATRON_TRAINING_STEP_DURATION_MS",
    "MEGATRON_TRAINING_THROUGHPUT_TFLOPS",
    "MEGATRON_TRAINING_TOKENS_PER_SEC",
    "record_training_metrics",
]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _TrainingInstruments:
    step_duration_ms: Any
    loss: Any
    throughput_tflops: Any
    grad_norm: Any
    skipped_iters: Any
    learning_rate: Any
    tokens_per_sec: Any
    memory_allocated_gb: Any


#: meter -> its instruments. Weak keys: the cache must not keep a shut-down
#: handle's meter (and through it the whole MeterProvider) alive.
_TRAINING_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _TrainingInstruments] = (
    weakref.WeakKeyDictionary()
)

#: Meters whose recording already failed once, so a broken meter logs one
#: warning instead of one per iteration.
_WARNED_METERS: weakref.WeakSet[Any] = weakref.WeakSet()

# (field, name, unit, description) for the six gauges, in one place so the
# names, units and descriptions cannot drift apart.
_GAUGES = (
    ("loss", MEGATRON_TRAINING_LOSS, "1", "Training loss of the iteration"),
    (
        "throughput_tflops",
        MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
        "TFLOP/s",
        "Model throughput per GPU",
    ),
    ("grad_norm", MEGATRON_TRAINING_GRAD_NORM, "1", "Global gradient norm"),
    ("learning_rate", MEGATRON_TRAINING_LEARNING_RATE, "1", "Learning rate"),
    (
        "tokens_per_sec",
        MEGATRON_TRAINING_TOKENS_PER_SEC,
        "{token}/s",
        "Tokens processed per second",
    ),
    (
        "memory_allocated_gb",
        MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
        "GBy",
        "Accelerator memory allocated",
    ),
)


def _create_instruments(meter: Any) -> _TrainingInstruments:
    gauges = {
        field: meter.create_gauge(name=name, unit=unit, description=description)
        for field, name, unit, description in _GAUGES
    }
    return _TrainingInstruments(
        step_duration_ms=meter.create_histogram(
            name=MEGATRON_TRAINING_STEP_DURATION_MS,
            unit="ms",
            description="Wall-clock duration of a training iteration",
        ),
        skipped_iters=meter.create_counter(
            name=MEGATRON_TRAINING_SKIPPED_ITERS,
            unit="{iteration}",
            description="Iterations skipped (for example on loss-scale overflow)",
        ),
        **gauges,
    )


def _instruments_for(meter: Any) -> _TrainingInstruments | None:
    # TypeError: a meter that cannot be weakly referenced or hashed is
    # served, just never cached.
    with contextlib.suppress(KeyError, TypeError):
        return _TRAINING_INSTRUMENTS[meter]
    try:
        instruments = _create_instruments(meter)
    except Exception:
        _logger.warning("Failed to create training metric instruments", exc_info=True)
        return None
    with contextlib.suppress(TypeError):
        _TRAINING_INSTRUMENTS[meter] = instruments
    return instruments


def record_training_metrics(
    meter: Any,
    step_duration_ms: float | None = None,
    loss: float | None = None,
    throughput_tflops: float | None = None,
    grad_norm: Any = None,
    skipped_iters: int | None = None,
    learning_rate: float | None = None,
    tokens_per_sec: float | None = None,
    memory_allocated_gb: float | None = None,
) -> None:
    """Record one iteration's metrics on ``meter``; ``None`` means "not known".

    Values go through ``float()`` (``int()`` for the counter) so callers can
    pass torch or numpy scalars. Zero is a real value and is recorded, except
    for the skipped-iterations counter, to which only positive counts are
    added. Never raises: telemetry must not stop a training run.
    """
    if metrics is None or meter is None:
        return
    instruments = _instruments_for(meter)
    if instruments is None:
        return
    _record(meter, instruments.step_duration_ms.record, step_duration_ms)
    _record(meter, instruments.loss.set, loss)
    _record(meter, instruments.throughput_tflops.set, throughput_tflops)
    _record(meter, instruments.grad_norm.set, grad_norm)
    _record(meter, instruments.learning_rate.set, learning_rate)
    _record(meter, instruments.tokens_per_sec.set, tokens_per_sec)
    _record(meter, instruments.memory_allocated_gb.set, memory_allocated_gb)
    _record(meter, instruments.skipped_iters.add, skipped_iters, counter=True)


def _record(meter: Any, sink: Any, value: Any, counter: bool = False) -> None:
    """Hand one value to one instrument.

    One ``try`` per value: a value that cannot be converted (a tensor with
    several elements) must not cost the iteration's other metrics. A meter
    that fails is reported once, not once per iteration.
    """
    if value is None:
        return
    try:
        if counter:
            count = int(value)
            if count > 0:
                sink(count)
        else:
            sink(float(value))
    except Exception:
        if _first_failure(meter):
            _logger.warning("Failed to record training metrics", exc_info=True)


def _first_failure(meter: Any) -> bool:
    try:
        if meter in _WARNED_METERS:
            return False
        _WARNED_METERS.add(meter)
    except TypeError:
        pass
    return True
