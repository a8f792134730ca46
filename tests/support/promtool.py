"""Where ``promtool`` is (Debian's ``prometheus`` package), for the tests that run it.

``tox -e promtool`` sets ``MEGATRON_TEST_REQUIRE_PROMTOOL=1``: there a missing
``promtool`` fails the test. Elsewhere the test skips, naming the environment
that runs it, so a machine without Prometheus still runs the rest.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED = os.environ.get("MEGATRON_TEST_REQUIRE_PROMTOOL") == "1"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed (apt-get install prometheus); tox -e promtool runs this"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    return found
