"""Which incarnations of different ranks are one launch of the job.

Every rank lives through the same launches (a restart starts them all, a kill of one
brings the others down), but a rank's file need not show every launch: one killed
before its first export left nothing, and ranks export at different moments, so one
rank's file may hold a launch another's lacks. Counting incarnations by position would
then pair different launches. Two incarnations of different ranks are of one launch when
their lifetimes (first record to last) overlap: a launch's ranks run side by side, one
launch's processes are gone before the next one's start.
"""

from __future__ import annotations

from megatron.trace.model.incarnation import Incarnation

__all__ = ["same_launch"]


def same_launch(job: list[Incarnation], other: list[Incarnation]) -> list[Incarnation | None]:
    """Per incarnation of ``job`` (one rank's, in time order), ``other``'s incarnation of
    the same launch (``other`` another rank's, in time order; None where its file shows
    none)."""
    found: list[Incarnation | None] = [None] * len(job)
    mine = theirs = 0
    while mine < len(job) and theirs < len(other):
        a, b = job[mine], other[theirs]
        if a.start_ns <= b.end_ns and b.start_ns <= a.end_ns:
            found[mine] = b
            mine, theirs = mine + 1, theirs + 1
        elif a.end_ns < b.start_ns:
            mine += 1
        else:
            theirs += 1
    return found
