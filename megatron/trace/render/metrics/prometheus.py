"""A live job's figures as Prometheus metrics (``megatron-trace watch``'s endpoint).

:class:`SnapshotCollector` is a ``prometheus_client`` collector: at each
scrape it asks for the newest :class:`~megatron.trace.live.job.Snapshot`
and turns it into metric families, every series labelled with ``run_id``
(:class:`~megatron.trace.live.job.LiveJob`'s, fixed by the first record) and
``rank``: not ``job`` nor ``instance``, which Prometheus sets from its scrape
config (a default scrape config keeps both labels as served). Names follow Prometheus's conventions
(base units, ``_seconds``, ``_ratio``, ``_total`` on counters only), and the
goodput ones are the in-process live metrics' (``megatron.training.goodput_s``
and its siblings, ``megatron/training/README.md``) in those conventions, so
one dashboard serves a job of ours and a watched Megatron-LM job alike.
``prometheus_client`` is imported only here (the ``watch`` extra).

The types mean what Prometheus assumes. ``megatron_training_goodput_seconds``
is a **gauge**: when a kill is seen, the progress since the last checkpoint
turns from goodput into ``wasted_progress`` badput, and the gauge falls (use
``delta()``/``deriv()`` on it, never ``rate()``). What only grows is a counter
of its own: ``megatron_training_progress_seconds_total`` (time that made
training progress, kept or later lost: goodput plus wasted progress) and
``megatron_training_lost_progress_seconds_total`` (the part later lost), so
goodput = progress - lost and ``rate()`` of either is valid. Each counter is
served as its highest value so far, so it never goes lower between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from megatron.trace.live.job import Snapshot, snapshots
from megatron.trace.render.metrics.series import RANK_SERIES
from megatron.trace_format.errors import MissingExtraError
from megatron.trace_format.semconv import (
    LOST_PROGRESS_COUNTER,
    PROGRESS_COUNTER,
    WATCH_CORRUPT_LINES_COUNTER,
    WATCH_LINES_COUNTER,
    WATCH_SPANS,
    WATCH_TORN_LINES,
    Category,
)

__all__ = ["LABEL", "METRICS", "SnapshotCollector", "label", "prometheus_client"]

#: The label naming the run on every series (what the shipped rules group by).
LABEL = "run_id"

#: name -> (kind, help): every family the endpoint serves: each rank series
#: (:data:`~megatron.trace.render.metrics.series.RANK_SERIES`, its help naming its
#: OpenTelemetry name), the progress counters, and what the watch read.
METRICS: dict[str, tuple[str, str]] = {
    **{
        series.gauge.prometheus: ("gauge", f"{series.gauge.description} ({series.gauge.name}).")
        for series in RANK_SERIES
    },
    PROGRESS_COUNTER: (
        "counter",
        "Time spent making training progress so far, whether it survived or was lost later "
        "(goodput plus wasted progress): never decreases.",
    ),
    LOST_PROGRESS_COUNTER: (
        "counter",
        "Time whose training progress was lost so far (the wasted_progress badput): never "
        "decreases.",
    ),
    WATCH_SPANS: ("gauge", "Spans read from the watched trace files."),
    WATCH_LINES_COUNTER: ("counter", "Lines read from the watched trace files."),
    WATCH_CORRUPT_LINES_COUNTER: (
        "counter",
        "Damaged lines skipped in the watched trace files.",
    ),
    WATCH_TORN_LINES: ("gauge", "Torn writes seen in the watched trace files."),
}


def label(attribute: str) -> str:
    """A point attribute as a Prometheus label, which takes no dots: its last part
    (``megatron.badput.category`` -> ``category``)."""
    return attribute.rsplit(".", 1)[-1]


def prometheus_client() -> Any:
    """The ``prometheus_client`` module, or :class:`MissingExtraError` naming the extra."""
    try:
        import prometheus_client as module
        import prometheus_client.core  # the metric families, as module.core
    except ImportError:
        raise MissingExtraError("watch", "prometheus_client", "watch") from None
    return module


class SnapshotCollector:
    """Serves whatever ``snapshot()`` returns at scrape time: a job's figures, or several
    jobs' (each family once, a series per job's ``run_id``); nothing before a first span."""

    def __init__(self, snapshot: Callable[[], Snapshot | Sequence[Snapshot] | None]) -> None:
        self._snapshot = snapshot
        self._client = prometheus_client()
        self._highest: dict[tuple[str, ...], float] = {}

    def describe(self) -> list[Any]:
        return []  # unchecked: the families depend on the job

    def collect(self) -> Iterator[Any]:
        found = snapshots(self._snapshot())
        if not found:
            return
        yield from families(found, self._client, self._highest)


def families(
    snapshot: Snapshot | Sequence[Snapshot],
    client: Any,
    highest: dict[tuple[str, ...], float] | None = None,
) -> Iterator[Any]:
    """The metric families of one snapshot, or of several jobs' (each family once, holding
    every job's series); ``highest`` holds each counter series' highest value so far
    (between the scrapes of one collector), and is what a counter serves."""
    core = client.core
    highest = {} if highest is None else highest

    def counted(name: str, labels: list[str], value: float) -> None:
        key = (name, *labels)
        highest[key] = max(value, highest.get(key, value))
        family(name, "rank").add_metric(labels, highest[key])

    built: dict[str, Any] = {}

    def family(name: str, *labels: str) -> Any:
        if name not in built:
            kind, text = METRICS[name]
            make = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
            stem = name.removesuffix("_total") if kind == "counter" else name
            built[name] = make(stem, text, labels=[LABEL, *labels])
        return built[name]

    for job in snapshots(snapshot):
        run_id = job.run_id
        for figures in job.ranks:
            rank = [run_id, figures.rank]
            for series in RANK_SERIES:
                labels = [label(attribute) for attribute in series.labels]
                for value, extra in series.points(figures):
                    found = family(series.gauge.prometheus, "rank", *labels)
                    found.add_metric([*rank, *(extra[a] for a in series.labels)], value)
            lost = figures.badput_s.get(Category.WASTED_PROGRESS, 0.0)
            counted(PROGRESS_COUNTER, rank, figures.goodput_s + lost)
            counted(LOST_PROGRESS_COUNTER, rank, lost)
        family(WATCH_SPANS).add_metric([run_id], job.spans)
        family(WATCH_LINES_COUNTER).add_metric([run_id], job.lines)
        family(WATCH_CORRUPT_LINES_COUNTER).add_metric([run_id], job.corrupt_lines)
        family(WATCH_TORN_LINES).add_metric([run_id], job.torn_lines)
    yield from built.values()
