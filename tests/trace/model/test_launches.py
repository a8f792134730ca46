"""Which incarnations of different ranks are one launch (``model/launches.py``)."""

from __future__ import annotations

from megatron.trace.model.incarnation import Incarnation
from megatron.trace.model.launches import same_launch


def _incs(rank: str, *lives: tuple[int, int]) -> list[Incarnation]:
    return [
        Incarnation(rank, index, (rank,), start_ns=start, end_ns=end)
        for index, (start, end) in enumerate(lives)
    ]


def test_a_launch_one_rank_s_file_lacks_pairs_by_time_not_by_number() -> None:
    """Rank 1's file shows the launch at 20 s that rank 0's lacks (killed before rank 0's
    first export): rank 0's second incarnation is rank 1's third, and the one at 20 s is
    nobody's on rank 0."""
    job = _incs("0", (0, 10), (40, 60))
    other = _incs("1", (1, 11), (20, 22), (41, 59))
    assert [inc.index if inc else None for inc in same_launch(job, other)] == [0, 2]
    assert [inc.index if inc else None for inc in same_launch(other, job)] == [0, None, 1]


def test_a_killed_rank_s_short_record_still_overlaps_its_launch() -> None:
    """A rank killed early left only its first span: its life still overlaps the launch."""
    job = _incs("0", (0, 30), (50, 90))
    other = _incs("1", (0, 2), (50, 51))
    assert same_launch(job, other) == other
