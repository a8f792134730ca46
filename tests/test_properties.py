"""The property tests' examples (``tests/support/properties.py``): the same every run in
``tox``, ``mindeps`` and ``noextras``, so a red run is red again; new ones in ``explore``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import EXPLORE_EXAMPLES, EXPLORING, _count, _profile, examples


def _drawn() -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []

    @settings(max_examples=25)
    @given(st.integers(), st.text(max_size=4))
    def record(number: int, text: str) -> None:
        seen.append((number, text))

    record()
    return seen


@pytest.mark.skipif(EXPLORING, reason="tox -e explore draws new examples on purpose")
def test_two_runs_draw_the_same_examples() -> None:
    assert settings.default.derandomize and settings.default.database is None
    first = _drawn()
    assert len(set(first)) > 10  # examples, not one repeated
    assert _drawn() == first
    assert examples(30) == 30


@pytest.mark.skipif(not EXPLORING, reason="only tox -e explore explores")
def test_exploring_draws_new_examples_and_many() -> None:
    assert not settings.default.derandomize
    assert examples(30) == EXPLORE_EXAMPLES == settings.default.max_examples


@pytest.mark.parametrize(
    ("variable", "value", "read", "valid"),
    [
        ("MEGATRON_TEST_HYPOTHESIS", "random", _profile, "valid are fixed, explore"),
        ("MEGATRON_TEST_EXAMPLES", "many", _count, "valid is a whole number of examples"),
        ("MEGATRON_TEST_EXAMPLES", "0", _count, "valid is a whole number of examples"),
    ],
)
def test_a_bad_setting_names_the_variable_and_what_is_valid(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, read, valid: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}='{value}': {valid}"):
        read()
