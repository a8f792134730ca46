"""Settings for the whole test session, whichever tests it runs."""

from __future__ import annotations

import pytest
from processes import give_children_default_signals

try:
    from properties import load_profile
except ModuleNotFoundError as missing:  # tox -e upstream, beside-megatron: no hypothesis,
    if missing.name != "hypothesis":  # and no property tests to run
        raise
else:
    # The property tests' profile (fixed examples, or tox -e explore's fresh ones): loaded
    # before any test module is imported, since their settings objects inherit it.
    load_profile()


def pytest_configure(config: pytest.Config) -> None:
    # Before any test starts a child: the result must not depend on the signal
    # dispositions the suite inherited (a background job, nohup).
    give_children_default_signals()
