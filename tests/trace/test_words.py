"""Counts in every message read as English: one thing, several things."""

from __future__ import annotations

from megatron.trace_format.words import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "incarnation") == "1 incarnation"
    assert [counted(n, "rank") for n in (0, 2, 40)] == ["0 ranks", "2 ranks", "40 ranks"]
    assert counted(1, "span export") == "1 span export"
    assert counted(3, "entry", "entries") == "3 entries"
