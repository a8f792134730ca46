"""A live job's figures pushed over OTLP (``megatron-trace watch --otlp-endpoint``).

The Prometheus endpoint (:mod:`megatron.trace.render.metrics.prometheus`) is pulled;
a site whose metrics go through an OpenTelemetry collector wants them pushed
instead. :class:`OtlpPush` runs the SDK's own ``MeterProvider`` with a
``PeriodicExportingMetricReader`` and the OTLP/HTTP (protobuf) metric
exporter (:func:`_exporter`): at each export the reader's thread observes the gauges below from
the newest :class:`~megatron.trace.live.job.Snapshot`, every point with
the attributes ``run_id`` and ``rank``, as the Prometheus series are labelled
(:data:`~megatron.trace.render.metrics.series.RANK_SERIES` declares both).

The goodput gauges carry the in-process live metrics' names
(:data:`~megatron.trace_format.semconv.MEGATRON_TRAINING_GOODPUT_S` and its
siblings), so a dashboard on the collector's side charts a job of ours and a
watched Megatron-LM job alike. The exporter needs the ``otlp`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from megatron.trace.live.job import Snapshot, snapshots
from megatron.trace.render.metrics.series import RANK_SERIES, Points, RankSeries
from megatron.trace_format.errors import MissingExtraError
from megatron.trace_format.semconv import SERVICE_NAME

__all__ = ["OtlpPush"]

#: The service name of the pushed metrics' resource.
WATCH_SERVICE = "megatron-trace-watch"


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
        snapshot: Callable[[], Snapshot | Sequence[Snapshot] | None],
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

        def callback(series: RankSeries) -> Any:
            def observe(options: CallbackOptions) -> list[Observation]:
                points: Points = (
                    (value, {"run_id": job.run_id, "rank": figures.rank, **extra})
                    for job in snapshots(self._snapshot())  # one job, or each received one
                    for figures in job.ranks
                    for value, extra in series.points(figures)
                )
                return [Observation(value, attributes) for value, attributes in points]

            return observe

        for series in RANK_SERIES:
            gauge = series.gauge
            meter.create_observable_gauge(
                gauge.name,
                callbacks=[callback(series)],
                unit=gauge.unit,
                description=gauge.description,
            )

    def shutdown(self) -> None:
        """A last export of the figures, then stop the reader's thread."""
        self._provider.shutdown()
