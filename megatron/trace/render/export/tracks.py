"""The track of each lane in a Perfetto / Chrome trace: process and thread ids that mean one thing.

A viewer draws one track per thread, and trace processors read ids with
rules of their own. Perfetto's JSON importer, for one, treats a ``tid`` of 0
as the process's main thread, whose tid is the pid: rank 0 (``tid 0``) and
rank 1 (``tid 1``) of the process with ``pid 1`` then land on one track, and
every slice of one that overlaps the other's is dropped. So ids here are
never 0, no tid equals any pid, and no tid repeats across processes: nothing
is left for an importer to reinterpret.

* a process per incarnation: ``pid`` = incarnation + 1, named
  "incarnation N" (numbered as ``check`` and ``report`` number them);
* a thread per (incarnation, rank): ``tid`` = number of processes + 1 +
  the lane's position, named "rank R", sorted by rank within its process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from megatron.trace.render.lanes import Lane, LaneIndex

__all__ = ["Track", "Tracks"]


@dataclass(frozen=True)
class Track:
    """Where one lane's spans go, and what the viewer calls it."""

    lane: Lane
    pid: int
    tid: int
    process_name: str
    thread_name: str
    thread_sort_index: int  # the rank's position: ranks in order within a process


class Tracks:
    """One :class:`Track` per lane of a :class:`LaneIndex`."""

    def __init__(self, lanes: LaneIndex) -> None:
        ordered = lanes.lanes()
        processes = sorted({lane.incarnation for lane in ordered})
        first_tid = len(processes) + 1
        self._tracks = {
            lane: Track(
                lane,
                pid=lane.incarnation + 1,
                tid=first_tid + position,
                process_name=lanes.incarnation_name(lane.incarnation),
                thread_name=f"rank {lane.rank}",
                thread_sort_index=lanes.ranks.index(lane.rank),
            )
            for position, lane in enumerate(ordered)
        }

    def __iter__(self) -> Iterator[Track]:
        return iter(self._tracks.values())

    def __len__(self) -> int:
        return len(self._tracks)

    def of(self, lane: Lane) -> Track:
        return self._tracks[lane]
