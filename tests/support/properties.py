"""How the property tests (``@given``) draw their examples: the same ones every run, or new.

``tox``, ``tox -e mindeps`` and ``tox -e noextras`` run the ``fixed`` profile:
derandomized (each test's examples follow from the test itself, so two runs of the
same tree draw the same ones, and a red run is red again) and no example database
(a failure an earlier run saved would otherwise be replayed first, and the runs
would differ). ``tox -e explore`` runs the ``explore`` profile: fresh random
examples, :data:`EXPLORE_EXAMPLES` of each test (``MEGATRON_TEST_EXAMPLES``), the
failures saved in ``.hypothesis/`` to replay. What it finds becomes an ``@example``
on the test and a fix. ``MEGATRON_TEST_HYPOTHESIS`` selects the profile (``fixed``
when unset). Neither has a deadline or the ``too_slow`` health check: both measure
the machine's load, not the code.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["EXPLORE_EXAMPLES", "EXPLORING", "examples", "load_profile"]

_PROFILE_VARIABLE = "MEGATRON_TEST_HYPOTHESIS"
_PROFILES = ("fixed", "explore")
_COUNT_VARIABLE = "MEGATRON_TEST_EXAMPLES"


def _profile() -> str:
    name = os.environ.get(_PROFILE_VARIABLE, "fixed")
    if name not in _PROFILES:
        raise ValueError(f"{_PROFILE_VARIABLE}={name!r}: valid are {', '.join(_PROFILES)}")
    return name


def _count() -> int:
    text = os.environ.get(_COUNT_VARIABLE, "2000")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{_COUNT_VARIABLE}={text!r}: valid is a whole number of examples, >= 1")
    return int(text)


EXPLORING = _profile() == "explore"
EXPLORE_EXAMPLES = _count() if EXPLORING else 0


def load_profile() -> None:
    """Register both profiles and load the one :data:`_PROFILE_VARIABLE` names (from
    ``tests/conftest.py``, before any test module builds its settings: those inherit it)."""
    common = {
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow],
        "print_blob": True,
    }
    settings.register_profile("fixed", derandomize=True, database=None, **common)
    settings.register_profile(
        "explore", derandomize=False, max_examples=max(1, EXPLORE_EXAMPLES), **common
    )
    settings.load_profile(_profile())


def examples(count: int) -> int:
    """A test's number of examples: ``count`` in the fixed runs, the explore profile's
    when exploring (a test's own ``max_examples`` would otherwise cap the exploration)."""
    return EXPLORE_EXAMPLES if EXPLORING else count
