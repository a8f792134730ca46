"""``report --window``: the job rank's accounting per window of its wall clock.

The sweep (:func:`megatron.trace.analysis.accounting.rank_accounting` with
``window_ns``) gives each window's totals, which add up to the whole; this module
turns them into the report's window entries, with the iterations that ended in each.
"""

from __future__ import annotations

from megatron.trace.analysis.accounting import seconds
from megatron.trace.analysis.liveness import utc_text
from megatron.trace.analysis.report import WindowEntry
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    Category,
)

__all__ = ["TOP_BADPUT", "window_entries", "window_iterations"]


#: The badput categories a window names (the largest first, time > 0).
TOP_BADPUT = 3


def window_iterations(
    incs: list[Incarnation], windows: list[tuple[int, int, dict[str, int]]]
) -> list[tuple[int, int]] | None:
    """(iterations that ended in it, the sum of their durations in ns) per window, a part of
    the columns at a time (None without iteration spans). An iteration ending on a cut is
    the earlier window's."""
    if not any(inc.iterations for inc in incs):
        return None
    import numpy as np

    cuts = np.array([end for _, end, _ in windows[:-1]], dtype=np.int64)
    counts = np.zeros(len(windows), dtype=np.int64)
    sums = np.zeros(len(windows), dtype=np.float64)
    for inc in incs:
        for part in inc.iterations.parts():
            where = np.searchsorted(cuts, np.frombuffer(part.ends, dtype=np.int64), "left")
            counts += np.bincount(where, minlength=len(windows))
            sums += np.bincount(where, weights=part.durations(), minlength=len(windows))
    return [(int(count), int(total)) for count, total in zip(counts, sums, strict=True)]


def window_entries(
    windows: list[tuple[int, int, dict[str, int]]],
    not_computed: set[str],
    iterations: list[tuple[int, int]] | None,
) -> list[WindowEntry]:
    """Each window's accounting, as the whole report's (a category not computed for the
    whole is None in each window's ``badput_s``, its time still in ``accounting_ns``), its
    largest badput categories, ``top_badput``, and the iterations that ended in it (their
    count and mean duration: a slowdown shows there, as slower iterations are still
    goodput)."""
    first = windows[0][0]
    entries: list[WindowEntry] = []
    for index, (start, end, totals) in enumerate(windows):
        count, total_ns = iterations[index] if iterations is not None else (None, 0)
        wall = end - start
        largest = sorted(
            (c for c in BADPUT_CATEGORIES if totals[c] and c not in not_computed),
            key=lambda c: -totals[c],
        )
        entries.append(
            {
                "index": index,
                "start": utc_text(start),
                "start_s": seconds(start - first),
                "end_s": seconds(end - first),
                "wall_s": seconds(wall),
                "goodput_s": seconds(totals[Category.GOODPUT]),
                "goodput_fraction": round(totals[Category.GOODPUT] / wall, 6) if wall else 0.0,
                "badput_s": {
                    c: None if c in not_computed else seconds(totals[c]) for c in BADPUT_CATEGORIES
                },
                "accounting_ns": {
                    "wall": wall,
                    Category.GOODPUT: totals[Category.GOODPUT],
                    **{c: totals[c] for c in BADPUT_CATEGORIES},
                },
                "top_badput": largest[:TOP_BADPUT],
                "iterations": count,
                "iteration_mean_ms": round(total_ns / count / 1e6, 3) if count else None,
            }
        )
    return entries
