"""``tox -e noextras``: the trace tests where none of the ``trace`` extra's packages is installed.

That environment sets ``MEGATRON_TEST_WITHOUT_EXTRAS=1``. There, and only there,
the tests that exercise what only those packages do (drawing with plotly, reading
Perfetto's protos, zstd frames, msgspec's own decoder) are left out: the modules
below are not collected and tests marked ``needs_extras`` are deselected, while
``test_without_extras.py`` checks each command's answer without them. The
environment is checked to really lack every package. Everywhere else nothing is
left out, so a missing package fails as an import error.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

WITHOUT_EXTRAS = os.environ.get("MEGATRON_TEST_WITHOUT_EXTRAS") == "1"
EXTRA_PACKAGES = ("plotly", "zstandard", "msgspec", "perfetto")
HERE = Path(__file__).resolve().parent
# The modules whose every test needs one of the packages (paths from tests/trace).
NEEDS_EXTRAS_MODULES = frozenset(
    {
        "render/export/test_perfetto.py",
        "otlp/test_decode.py",
        "otlp/test_parallel.py",
        # the receive extra's grpcio and opentelemetry-proto (test_without_extras.py
        # checks the one line `receive` gives without them)
        "receive/test_receive.py",
        "receive/test_jobs.py",
        "receive/test_killed.py",
        "receive/test_convert.py",
        "render/timeline/test_write.py",
        "render/timeline/test_ranks.py",
        "render/timeline/test_many_ranks.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    if WITHOUT_EXTRAS:
        present = [name for name in EXTRA_PACKAGES if importlib.util.find_spec(name)]
        if present:
            raise pytest.UsageError(f"MEGATRON_TEST_WITHOUT_EXTRAS=1 but installed: {present}")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (
        WITHOUT_EXTRAS
        and collection_path.is_relative_to(HERE)
        and collection_path.relative_to(HERE).as_posix() in NEEDS_EXTRAS_MODULES
    ):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not WITHOUT_EXTRAS:
        return
    kept = [item for item in items if item.get_closest_marker("needs_extras") is None]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept
