"""Fixtures for ``tox -e browser``: a headless Debian Chromium driven by playwright.

The default ``tox`` run leaves this folder out (``norecursedirs`` in
pyproject.toml): it must pass with only Python, and a browser is a system
package. Here a missing browser is a failure, not a skip: this environment
exists to run them. Any test of a page in a real browser belongs here and can
take the ``browser`` fixture.
Playwright only drives the system Chromium; it never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str:
    """The browser binary: ``$CHROMIUM_PATH``, else Debian's ``chromium`` package."""
    given = os.environ.get("CHROMIUM_PATH")
    if given:
        return given
    for candidate in CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return shutil.which("chromium") or ""


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
        browser = playwright.chromium.launch(
            executable_path=path,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()
