"""The union of Megatron-LM's per-pass checkpoint spans: exactly the time they cover."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from megatron.trace._store.stretches import Stretches

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=40)


@given(spans)
def test_the_union_covers_exactly_the_nanoseconds_of_its_spans(pairs) -> None:
    union = Stretches()
    covered: set[int] = set()
    for start, length in pairs:  # any order: the reader sees spans in end order
        union.add(start, start + length)
        covered.update(range(start, start + length))
    assert union.covered() == len(covered)
    stretches = list(union)
    assert all(s < e for s, e in stretches)
    assert all(e1 < s2 for (_, e1), (s2, _) in itertools.pairwise(stretches))
    assert {t for s, e in stretches for t in range(s, e)} == covered


@given(spans, st.integers(0, 240), st.integers(0, 240))
def test_a_clip_keeps_the_part_inside(pairs, lo, hi) -> None:
    union = Stretches()
    for start, length in pairs:
        union.add(start, start + length)
    inside = {t for s, e in union for t in range(s, e) if lo <= t < hi}
    assert {t for s, e in union.clipped(lo, hi) for t in range(s, e)} == inside
