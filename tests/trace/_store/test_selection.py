"""Order statistics by selection: the values a sort puts at those ranks, to the bit."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from megatron.trace._store import selection


def _values(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 4000))
    kind = seed % 5
    if kind == 0:  # the whole int64 range, negatives too
        return rng.integers(-(2**63), 2**63 - 1, count, dtype=np.int64)
    if kind == 1:  # a handful of distinct values: ties everywhere
        return rng.integers(10**8, 10**8 + 5, count)
    if kind == 2:  # all equal
        return np.full(count, 7, dtype=np.int64)
    if kind == 3:  # iteration durations with outliers
        values = rng.normal(2e7, 1e5, count).astype(np.int64)
        values[rng.random(count) < 0.02] *= 3
        return values
    return rng.exponential(1e8, count).astype(np.int64)


@pytest.mark.parametrize("in_memory", [0, 1 << 16])
@pytest.mark.parametrize("seed", range(25))
def test_selected_values_are_those_a_sort_gives(
    seed: int, in_memory: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selection, "IN_MEMORY", in_memory)
    values = _values(seed)
    rng = np.random.default_rng(seed + 1000)
    chunks = np.array_split(values, int(rng.integers(1, 9)))  # some may be empty
    ranks = [0, len(values) - 1, *(int(r) for r in rng.integers(0, len(values), 5))]
    ordered = np.sort(values)
    assert selection.select(lambda: iter(chunks), ranks) == [int(ordered[r]) for r in ranks]
    # (a float, as the straggler medians always were)
    middle = float(statistics.median(values.tolist()))
    assert selection.median(lambda: iter(chunks)) == (middle, len(values))


def test_non_negative_floats_select_by_their_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "IN_MEMORY", 0)
    values = np.abs(np.random.default_rng(5).normal(0, 5, 3001))
    values[:10] = 0.0
    ordered = np.sort(values)
    ranks = [0, 9, 10, 1500, 3000]

    def keys() -> list[np.ndarray]:
        return [selection.float_keys(part) for part in np.array_split(values, 4)]

    chosen = selection.from_float_keys(selection.select(keys, ranks))
    assert chosen == [float(ordered[r]) for r in ranks]


def test_a_rank_outside_the_values_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        selection.select(lambda: [np.arange(3)], [3])
    assert selection.median(lambda: []) == (0.0, 0)
