"""``pip uninstall megatron-telemetry-spans`` leaves megatron-core whole (issue 30).

Uninstalling removes every file our ``RECORD`` lists: had we shipped one of
megatron-core's (its ``megatron/core/__init__.py``), megatron-core would be
broken once we are gone. The tox env keeps us installed for the other tests,
so this runs in a new venv of its own, as a user's: megatron-core installed
first (with torch and numpy, which its ``megatron/core/__init__.py`` imports),
then us from this source tree, then us uninstalled.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Beside

REPO_ROOT = Path(__file__).resolve().parents[2]
CORE, OURS = "megatron-core", "megatron-telemetry-spans"

_IMPORTS = """
import importlib, json
from megatron.core import InferenceParams
found = {}
for name in ("megatron.core.telemetry", "megatron.trace"):
    try:
        found[name] = importlib.import_module(name).__file__
    except ModuleNotFoundError:
        found[name] = None
print(json.dumps([InferenceParams.__module__, found]))
"""


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A new venv, removed afterwards (with torch in it, about 1 GB)."""
    path = tmp_path / "venv"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_megatron_core_stays_whole_through_our_install_and_uninstall(
    beside: Beside, venv: Path, tmp_path: Path, trace: Path
) -> None:
    beside.ok([sys.executable, "-m", "venv", venv])
    user = beside.using(venv / "bin" / "python")
    user.pip("install", "-q", "megatron-core==0.16.1")
    count, damaged = user.damaged(CORE)
    assert count > 400 and damaged == []

    # our sources alone (a build in the tree itself would leave build/ there)
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT / "megatron", source / "megatron", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    user.pip("install", "-q", source)
    assert user.damaged(CORE) == (count, [])
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    home, found = json.loads(user.code(_IMPORTS).splitlines()[-1])
    assert home.startswith("megatron.core.inference")
    assert found == {
        "megatron.core.telemetry": str(site / "megatron/core/telemetry/__init__.py"),
        "megatron.trace": str(site / "megatron/trace/__init__.py"),
    }
    user.trace_works(trace)

    user.pip("uninstall", "-y", OURS)
    assert user.damaged(CORE) == (count, [])
    home, found = json.loads(user.code(_IMPORTS).splitlines()[-1])
    assert home.startswith("megatron.core.inference")
    assert found == {"megatron.core.telemetry": None, "megatron.trace": None}
    assert not (venv / "bin" / "megatron-trace").exists()
    assert sorted(p.name for p in (site / "megatron").iterdir()) == ["core"]
