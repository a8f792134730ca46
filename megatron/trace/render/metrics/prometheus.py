"""A live job's figures as Prometheus metrics (``megatron-trace watch``'s endpoint).

:class:`SnapshotCollector` is a ``prometheus_client`` collector: at each
scrape it asks for the newest :class:`~megatron.trace.live.job.Snapshot`
and turns it into metric families, every series labelled with ``job`` (the
run id, ``nemo.run.id``) and ``rank``. Names follow Prometheus's conventions
(base units, ``_seconds``, ``_ratio``, ``_total`` on counters only), and the
goodput ones are the in-process live metrics' (``megatron.training.goodput_s``
and its siblings, ``megatron/training/README.md``) in those conventions, so
one dashboard serves a job of ours and a watched Megatron-LM job alike.
``prometheus_client`` is imported only here (the ``watch`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from megatron.trace.live.job import STATES, Snapshot
from megatron.trace_format.errors import MissingExtraError
from megatron.trace_format.semconv import (
    GOODPUT_GAUGES,
    MEGATRON_TRAINING_BADPUT_S,
    MEGATRON_TRAINING_GOODPUT_FRACTION,
    MEGATRON_TRAINING_GOODPUT_S,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_WALL_CLOCK_S,
)

__all__ = ["METRICS", "SnapshotCollector", "prometheus_client"]

#: name -> (kind, help): every family the endpoint serves.
METRICS: dict[str, tuple[str, str]] = {
    **{
        gauge.prometheus: ("gauge", f"{gauge.description} ({gauge.name}).")
        for gauge in GOODPUT_GAUGES.values()
    },
    "megatron_job_state": (
        "gauge",
        "1 for the rank's state (running, finished, stalled, killed), 0 for the others.",
    ),
    "megatron_hang_suspected": (
        "gauge",
        "1 while the rank's iterations have stopped for longer than max(floor, factor x its "
        "rolling median iteration time), or the hang watchdog reported a stall.",
    ),
    "megatron_hang_seconds": ("gauge", "How long the suspected hang has lasted (0: none)."),
    "megatron_iteration_time_seconds": (
        "gauge",
        "The median time of the rank's last iterations (its rolling iteration time).",
    ),
    "megatron_straggler_score": (
        "gauge",
        "The fastest rank's median work per iteration over this rank's (1: the fastest).",
    ),
    "megatron_trace_watch_spans": ("gauge", "Spans read from the watched trace files."),
    "megatron_trace_watch_lines_total": ("counter", "Lines read from the watched trace files."),
    "megatron_trace_watch_corrupt_lines_total": (
        "counter",
        "Damaged lines skipped in the watched trace files.",
    ),
    "megatron_trace_watch_torn_lines": ("gauge", "Torn writes seen in the watched trace files."),
}


def prometheus_client() -> Any:
    """The ``prometheus_client`` module, or :class:`MissingExtraError` naming the extra."""
    try:
        import prometheus_client as module
        import prometheus_client.core  # the metric families, as module.core
    except ImportError:
        raise MissingExtraError("watch", "prometheus_client", "watch") from None
    return module


class SnapshotCollector:
    """Serves whatever ``snapshot()`` returns at scrape time (nothing before the first span)."""

    def __init__(self, snapshot: Callable[[], Snapshot | None]) -> None:
        self._snapshot = snapshot
        self._client = prometheus_client()

    def describe(self) -> list[Any]:
        return []  # unchecked: the families depend on the job

    def collect(self) -> Iterator[Any]:
        snapshot = self._snapshot()
        if snapshot is None:
            return
        yield from families(snapshot, self._client)


def families(snapshot: Snapshot, client: Any) -> Iterator[Any]:
    """The metric families of one snapshot."""
    core = client.core
    built: dict[str, Any] = {}

    def family(name: str, *labels: str) -> Any:
        if name not in built:
            kind, text = METRICS[name]
            make = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
            stem = name.removesuffix("_total") if kind == "counter" else name
            built[name] = make(stem, text, labels=["job", *labels])
        return built[name]

    job = snapshot.job
    for figures in snapshot.ranks:
        rank = [job, figures.rank]
        family(GOODPUT_GAUGES[MEGATRON_TRAINING_GOODPUT_S].prometheus, "rank").add_metric(
            rank, figures.goodput_s
        )
        badput = family(GOODPUT_GAUGES[MEGATRON_TRAINING_BADPUT_S].prometheus, "rank", "category")
        for category, seconds in figures.badput_s.items():
            badput.add_metric([*rank, str(getattr(category, "value", category))], seconds)
        wall = family(GOODPUT_GAUGES[MEGATRON_TRAINING_WALL_CLOCK_S].prometheus, "rank")
        wall.add_metric(rank, figures.wall_s)
        ratio = figures.goodput_s / figures.wall_s if figures.wall_s else 0.0
        family(GOODPUT_GAUGES[MEGATRON_TRAINING_GOODPUT_FRACTION].prometheus, "rank").add_metric(
            rank, ratio
        )
        if figures.iteration is not None:
            family(GOODPUT_GAUGES[MEGATRON_TRAINING_ITERATION].prometheus, "rank").add_metric(
                rank, figures.iteration
            )
        states = family("megatron_job_state", "rank", "state")
        for state in STATES:
            states.add_metric([*rank, state], 1.0 if figures.state == state else 0.0)
        if figures.hang_suspected is not None:
            suspected = family("megatron_hang_suspected", "rank")
            suspected.add_metric(rank, 1.0 if figures.hang_suspected else 0.0)
            family("megatron_hang_seconds", "rank").add_metric(rank, figures.hang_s or 0.0)
        if figures.iteration_time_s is not None:
            rolling = family("megatron_iteration_time_seconds", "rank")
            rolling.add_metric(rank, figures.iteration_time_s)
        if figures.straggler_score is not None:
            score = family("megatron_straggler_score", "rank")
            score.add_metric(rank, figures.straggler_score)
    family("megatron_trace_watch_spans").add_metric([job], snapshot.spans)
    family("megatron_trace_watch_lines_total").add_metric([job], snapshot.lines)
    corrupt = family("megatron_trace_watch_corrupt_lines_total")
    corrupt.add_metric([job], snapshot.corrupt_lines)
    family("megatron_trace_watch_torn_lines").add_metric([job], snapshot.torn_lines)
    yield from built.values()
