"""The heartbeat: what tells a reader that a job is still alive.

With the ``default`` span groups nothing reaches the trace file while a
checkpoint interval is open, which may be hours; a reader that sees the last
interval's successor missing cannot tell a job that is still training from
one that was SIGKILLed. So every metrics export (the periodic one, every
:data:`HEARTBEAT_PERIOD_S` seconds with the ``jsonl`` sink, and the last
one at shutdown) carries one gauge, :data:`HEARTBEAT_METRIC`: 1 while the
telemetry handle is up, 0 in the export telemetry shutdown makes.

It costs the training loop nothing: the value is observed by the metric
reader's own thread when it collects, from one boolean, and it rides in the
line that export writes anyway (each data point carries its collection
time, which is what a reader needs).

The reader's rule (``megatron-trace``, :mod:`megatron.trace.analysis.liveness`): an
incarnation that has not been seen to end is *running* while its newest
record (heartbeat or span) is at most :data:`STALE_AFTER_S` old, and
*killed* after that. The bound is three export periods, so two missed or
late exports do not declare a live job dead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from megatron.trace_format.semconv import HEARTBEAT_METRIC, HEARTBEAT_PERIOD_S, STALE_AFTER_S

if TYPE_CHECKING:  # imported where a job registers the gauge: readers need only the names
    from opentelemetry.metrics import CallbackOptions, Observation

__all__ = [
    "HEARTBEAT_METRIC",
    "HEARTBEAT_PERIOD_S",
    "STALE_AFTER_S",
    "register_heartbeat",
]

_logger = logging.getLogger(__name__)


def register_heartbeat(meter: Any, is_running: Callable[[], bool]) -> None:
    """Observe ``is_running()`` as :data:`HEARTBEAT_METRIC` at every collection of ``meter``.

    Never raises: a meter that cannot create the gauge is logged once.
    """
    from opentelemetry.metrics import Observation

    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if is_running() else 0)]

    try:
        meter.create_observable_gauge(
            HEARTBEAT_METRIC,
            callbacks=[observe],
            unit="1",
            description="1 while the training job's telemetry is up; 0 in the export at shutdown",
        )
    except Exception:
        _logger.warning("Could not create the telemetry heartbeat gauge", exc_info=True)
