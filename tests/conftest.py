"""Settings for the whole test session, whichever tests it runs."""

from __future__ import annotations

import pytest
from processes import give_children_default_signals


def pytest_configure(config: pytest.Config) -> None:
    # Before any test starts a child: the result must not depend on the signal
    # dispositions the suite inherited (a background job, nohup).
    give_children_default_signals()
