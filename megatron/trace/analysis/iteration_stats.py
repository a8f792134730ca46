"""The report's iteration figures: median, p90 and maximum duration, and the anomalies.

Exact order statistics, selected a radix digit at a time over the iteration columns
a part at a time (:mod:`megatron.trace._store.selection`), so the memory does not
grow with the job's length; an iteration is anomalous by :data:`ANOMALY_RULE`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Any

from megatron.trace._store.selection import float_keys, from_float_keys, select
from megatron.trace.analysis.report import IterationStats
from megatron.trace.model.incarnation import Incarnation

__all__ = [
    "ANOMALY_MAD_FACTOR",
    "ANOMALY_MAD_FLOOR",
    "ANOMALY_MAX_SHARE",
    "ANOMALY_RULE",
    "iteration_stats",
]


#: k of the anomaly rule: an iteration is anomalous when it took longer than
#: median + k * MAD of the iteration durations (ml-goodput-measurement's k).
ANOMALY_MAD_FACTOR = 3.0


#: The MAD is floored at this share of the median, so nothing within 45 % of the
#: median is anomalous: a steady run's jitter (lognormal, sigma 0.1: 95 % of the
#: iterations within 20 % of the median, as on a busy machine) flags none (the 1 %
#: floor flagged two of 60), while a 1.5 x slowdown is still found.
ANOMALY_MAD_FLOOR = 0.15


#: More iterations than this share of them (and more than one) over the threshold are
#: not anomalies but the run's own spread (a machine so loaded its iterations vary
#: several-fold, or a lasting slowdown): the count is then not computed.
ANOMALY_MAX_SHARE = 0.1


ANOMALY_RULE = (
    f"duration > median + {ANOMALY_MAD_FACTOR:g} x MAD "
    f"(median absolute deviation of the iteration durations, at least "
    f"{100 * ANOMALY_MAD_FLOOR:g} % of the median); not computed when over "
    f"{100 * ANOMALY_MAX_SHARE:g} % of the iterations (and more than one) are over it"
)


_LISTED_ANOMALIES = 20


def _duration_parts(incs: list[Incarnation]) -> Iterator[tuple[Incarnation, Any, Any]]:
    """(incarnation, numbers, durations in ns) of every iteration, a part of the columns at
    a time (the durations an int64 numpy array)."""
    for inc in incs:
        for part in inc.iterations.parts():
            yield inc, part.numbers, part.durations()


def _in_ms(ns: Any) -> Any:
    """Durations in ns as float64 ms, each as ``(end - start) / 1e6`` gives it (a new
    array): what the figures are made of, with numpy or without."""
    import numpy as np

    ms = ns.astype(np.float64)
    ms /= 1e6
    return ms


def _sorted_figures(incs: list[Incarnation], count: int) -> tuple[float, float, float, float]:
    """(median, MAD, p90, max) of every iteration's duration (ms), as a sort of them all
    would give them, by selection over the columns a part at a time
    (:mod:`megatron.trace._store.selection`): flat in memory however long the job."""
    import numpy as np

    def durations() -> Iterator[Any]:
        return (ns for _, _, ns in _duration_parts(incs))

    middle = count // 2
    halves = [middle] if count % 2 else [middle - 1, middle]
    p90_rank = max(0, math.ceil(0.9 * count) - 1)  # nearest rank
    *median_ns, p90_ns, longest_ns = select(durations, [*halves, p90_rank, count - 1])
    # ns -> ms as the figures always were: each value / 1e6, then the mean of the halves
    median = sum(ns / 1e6 for ns in median_ns) / len(median_ns)

    def deviations() -> Iterator[Any]:  # |duration - median|, the MAD's values (ms)
        for ns in durations():
            ms = _in_ms(ns)
            ms -= median
            yield float_keys(np.abs(ms, out=ms))

    mad_halves = from_float_keys(select(deviations, halves))
    return median, sum(mad_halves) / len(mad_halves), p90_ns / 1e6, longest_ns / 1e6


def _slowest_of(incs: list[Incarnation], threshold: float) -> tuple[int, list[tuple]]:
    """How many iterations last over ``threshold`` ms, and the longest of them as
    (duration ms, incarnation index, iteration), longest first."""
    import numpy as np

    count, slowest = 0, []
    for inc, numbers, ns in _duration_parts(incs):
        ms = _in_ms(ns)
        over = np.flatnonzero(ms > threshold).tolist()
        count += len(over)
        found = [(float(ms[at]), inc.index, numbers[at]) for at in over]
        slowest = heapq.nlargest(_LISTED_ANOMALIES, [*slowest, *found])
    return count, slowest


def iteration_stats(incs: list[Incarnation]) -> IterationStats | None:
    """The iteration figures of ``incs``: exact order statistics selected over the columns a
    part at a time (:func:`_sorted_figures`), then the anomalies against them."""
    count = sum(len(inc.iterations) for inc in incs)
    if not count:
        return None
    median, mad, p90, longest = _sorted_figures(incs, count)
    mad = max(mad, ANOMALY_MAD_FLOOR * median)
    threshold = median + ANOMALY_MAD_FACTOR * mad
    slow_count, slow = _slowest_of(incs, threshold)
    steady = slow_count <= max(1, ANOMALY_MAX_SHARE * count)
    return {
        "count": count,
        "median_ms": round(median, 3),
        "p90_ms": round(float(p90), 3),
        "max_ms": round(float(longest), 3),
        "anomalous": {
            "rule": ANOMALY_RULE,
            "mad_ms": round(mad, 3),
            "threshold_ms": round(threshold, 3),
            "count": slow_count if steady else None,
            "slowest": [
                {"incarnation": index, "iteration": number, "duration_ms": round(dur, 3)}
                for dur, index, number in slow[:_LISTED_ANOMALIES]
            ]
            if steady
            else [],
        },
    }
