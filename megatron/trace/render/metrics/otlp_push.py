"""A live job's figures pushed over OTLP (``megatron-trace watch --otlp-endpoint``).

The Prometheus endpoint (:mod:`megatron.trace.render.metrics.prometheus`) is pulled;
a site whose metrics go through an OpenTelemetry collector wants them pushed
instead. :class:`OtlpPush` runs the SDK's own ``MeterProvider`` with a
``PeriodicExportingMetricReader`` and the OTLP/HTTP (protobuf) metric
exporter (:func:`_exporter`): at each export the reader's thread observes the gauges below from
the newest :class:`~megatron.trace.live.job.Snapshot`, every point with
the attributes ``job`` and ``rank``, as the Prometheus series are labelled.

The goodput gauges carry the in-process live metrics' names
(:data:`~megatron.trace_format.semconv.MEGATRON_TRAINING_GOODPUT_S` and its
siblings), so a dashboard on the collector's side charts a job of ours and a
watched Megatron-LM job alike. The exporter needs the ``otlp`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from megatron.trace.live.job import STATES, RankFigures, Snapshot
from megatron.trace_format.errors import MissingExtraError
from megatron.trace_format.semconv import (
    BADPUT_CATEGORY_ATTRIBUTE,
    GOODPUT_GAUGES,
    MEGATRON_TRAINING_BADPUT_S,
    MEGATRON_TRAINING_GOODPUT_FRACTION,
    MEGATRON_TRAINING_GOODPUT_S,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_WALL_CLOCK_S,
    SERVICE_NAME,
)

__all__ = ["GAUGES", "OtlpPush"]

#: The service name of the pushed metrics' resource.
WATCH_SERVICE = "megatron-trace-watch"

Points = Iterable[tuple[float, dict[str, str]]]


def _state(figures: RankFigures) -> Points:
    return [(1.0 if figures.state == state else 0.0, {"state": state}) for state in STATES]


def _badput(figures: RankFigures) -> Points:
    return [
        (seconds, {BADPUT_CATEGORY_ATTRIBUTE: str(getattr(category, "value", category))})
        for category, seconds in figures.badput_s.items()
    ]


def _one(value: float | int | bool | None) -> Points:
    return [] if value is None else [(float(value), {})]


_GOODPUT_POINTS: dict[str, Callable[[RankFigures], Points]] = {
    MEGATRON_TRAINING_GOODPUT_S: lambda f: _one(f.goodput_s),
    MEGATRON_TRAINING_BADPUT_S: _badput,
    MEGATRON_TRAINING_WALL_CLOCK_S: lambda f: _one(f.wall_s),
    MEGATRON_TRAINING_GOODPUT_FRACTION: lambda f: _one(f.goodput_s / f.wall_s if f.wall_s else 0.0),
    MEGATRON_TRAINING_ITERATION: lambda f: _one(f.iteration),
}

#: name -> (unit, description, the points of one rank's figures): every gauge pushed, the
#: goodput ones as the trainer declares them (:data:`.semconv.GOODPUT_GAUGES`).
GAUGES: dict[str, tuple[str, str, Callable[[RankFigures], Points]]] = {
    **{
        name: (gauge.unit, gauge.description, _GOODPUT_POINTS[name])
        for name, gauge in GOODPUT_GAUGES.items()
    },
    "megatron.job.state": (
        "1",
        "1 for the rank's state (running, finished, stalled, killed), 0 for the others",
        _state,
    ),
    "megatron.hang.suspected": (
        "1",
        "1 while a hang is suspected on the rank",
        lambda f: _one(f.hang_suspected),
    ),
    "megatron.hang.duration_s": (
        "s",
        "How long the suspected hang has lasted (0: none)",
        lambda f: [] if f.hang_suspected is None else _one(f.hang_s or 0.0),
    ),
    "megatron.training.iteration_time_s": (
        "s",
        "The median of the rank's last loop passes",
        lambda f: _one(f.iteration_time_s),
    ),
    "megatron.straggler.score": (
        "1",
        "The rank's straggler score (1.0: the fastest rank)",
        lambda f: _one(f.straggler_score),
    ),
}


def _exporter(endpoint: str, say: Callable[[str], None]) -> Any:
    """The SDK's OTLP/HTTP metric exporter, saying once (through ``say``) when pushes start
    failing and once when they succeed again, instead of the SDK's log lines at every retry
    of every export: a collector that is down is one line, and the watch goes on."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        raise MissingExtraError(
            "watch --otlp-endpoint", "opentelemetry-exporter-otlp-proto-http", "otlp"
        ) from None
    from opentelemetry.sdk.metrics.export import MetricExportResult

    logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)

    class Exporter(OTLPMetricExporter):  # type: ignore[misc]
        failing = False

        def export(self, metrics_data: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = super().export(metrics_data, *args, **kwargs)
            except Exception:  # noqa: BLE001 (older exporters raise where newer ones return FAILURE)
                result = MetricExportResult.FAILURE
            failing = result is not MetricExportResult.SUCCESS
            if failing != self.failing:
                self.failing = failing
                say(
                    f"warning: cannot push to {endpoint}; trying again at every export"
                    if failing
                    else f"pushing to {endpoint} again"
                )
            return result

    return Exporter(endpoint=endpoint)


class OtlpPush:
    """Pushes ``snapshot()``'s figures to ``endpoint`` every ``interval_s`` seconds, and once
    more at :meth:`shutdown`."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot | None],
        endpoint: str,
        interval_s: float,
        say: Callable[[str], None],
    ) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._snapshot = snapshot
        reader = PeriodicExportingMetricReader(
            _exporter(endpoint, say),
            export_interval_millis=interval_s * 1000,
        )
        self._provider = MeterProvider(
            resource=Resource.create({SERVICE_NAME: WATCH_SERVICE}),
            metric_readers=[reader],
            shutdown_on_exit=False,
        )
        meter = self._provider.get_meter("megatron.trace.watch")

        def callback(points: Callable[[RankFigures], Points]) -> Any:
            def observe(options: CallbackOptions) -> list[Observation]:
                snapshot = self._snapshot()
                if snapshot is None:
                    return []
                return [
                    Observation(value, {"job": snapshot.job, "rank": figures.rank, **extra})
                    for figures in snapshot.ranks
                    for value, extra in points(figures)
                ]

            return observe

        for name, (unit, description, points) in GAUGES.items():
            meter.create_observable_gauge(
                name, callbacks=[callback(points)], unit=unit, description=description
            )

    def shutdown(self) -> None:
        """A last export of the figures, then stop the reader's thread."""
        self._provider.shutdown()
