"""How an incarnation ended: the rule stated once in ``megatron/trace/README.md``.

:attr:`~megatron.trace.model.incarnation.Incarnation.ended` is ``shutdown``,
``failed``, ``interrupted``, ``cut_short``, ``restarted``, ``killed``, or ``running`` (which
:func:`megatron.trace.analysis.liveness.judge` sets); this module applies the
rule to an incarnation's records, and the report, ``check``, the timeline and
the export read the result from the incarnation.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable
from typing import Any

from megatron.trace._store.record_log import latest
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    ERROR_TYPE,
    INTERVAL_REROOTED,
    SHUTDOWN_REASON,
    SHUTDOWN_REASON_INPROCESS_RESTART,
)

__all__ = ["EndingScan", "lost_next"]


# The lifecycle's shutdown reason -> how the incarnation ended (strongest first). A cycle
# of an in-process restart (NVRx) that a fault ended, NVRx calling pretrain() again in
# the same process, is ``restarted``.
_ENDED_BY_REASON = {
    SHUTDOWN_REASON_INPROCESS_RESTART: "restarted",
    "exception": "failed",
    "interrupt": "interrupted",
    "signal": "cut_short",
}


class EndingScan:
    """How an incarnation's spans say it ended (the rule in ``megatron/trace/README.md``),
    its search for a shutdown reason kept between finishes: the reasons the startup and
    the intervals scanned so far carry (each with the error type of the first record
    that gave it), so a finish decodes only the intervals added since."""

    __slots__ = ("intervals", "reasons", "startup")

    def __init__(self) -> None:
        self.startup: int | None = -1  # the startup's position scanned (-1: none yet)
        self.intervals = array("q")  # the intervals' positions scanned, in order
        self.reasons: dict[str, Any] = {}

    def ending(
        self, inc: Incarnation, startup: int | None, intervals: array
    ) -> tuple[str, str | None]:
        """How the lifecycle's shutdown said ``inc`` ended, and the error type: the first
        record (its startup, then its intervals in order) of the strongest reason."""
        done = len(self.intervals)
        if self.startup == startup and intervals[:done] == self.intervals:
            records: Iterable[SpanRecord | None] = inc.intervals[done:]
        else:  # (an interval placed before others: scanned again from the start)
            self.startup, self.reasons = startup, {}
            records = itertools.chain([inc.startup], inc.intervals)
        for record in records:
            if record is None or SHUTDOWN_REASON not in record["attributes"]:
                continue
            reason = record["attributes"][SHUTDOWN_REASON]
            if isinstance(reason, str) and reason not in self.reasons:
                self.reasons[reason] = record["attributes"].get(ERROR_TYPE)
        self.intervals = array("q", intervals)
        for reason, ended in _ENDED_BY_REASON.items():
            if reason in self.reasons:
                return ended, self.reasons[reason]
        return ("cut_short" if inc.cut_short else "shutdown"), None


def lost_next(inc: Incarnation) -> bool:
    """Whether the incarnation's last interval was closed by a reroot that opened
    an interval the file does not hold (it was in flight at a SIGKILL)."""
    if not inc.intervals:
        return False
    last = latest(inc.intervals)
    return last is not None and last["attributes"].get(INTERVAL_REROOTED) is True
