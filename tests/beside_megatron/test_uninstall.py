"""``pip uninstall megatron-telemetry-spans`` leaves megatron-core whole (issue 30).

Uninstalling removes every file our ``RECORD`` lists: had we shipped one of
megatron-core's (its ``megatron/core/__init__.py``), megatron-core would be
broken once we are gone. The tox env keeps us installed for the other tests,
so this runs in a new venv of its own, as a user's: megatron-core installed
first, then us from this source tree, then us uninstalled. The venv borrows the
tox env's other packages (torch and numpy, which megatron-core's
``megatron/core/__init__.py`` imports, and our dependencies), so pip finds them
installed instead of unpacking torch again (a minute; see ``Beside.new_venv``):
every ``megatron`` file and both distributions' metadata are the venv's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Beside

CORE, OURS = "megatron-core", "megatron-telemetry-spans"

_IMPORTS = """
import importlib, json
from megatron.core import InferenceParams
found = {}
for name in ("megatron.core", "megatron.core.telemetry", "megatron.trace_format", "megatron.trace"):
    try:
        found[name] = importlib.import_module(name).__file__
    except ModuleNotFoundError:
        found[name] = None
print(json.dumps([InferenceParams.__module__, found]))
"""


def test_megatron_core_stays_whole_through_our_install_and_uninstall(
    beside: Beside, site: Path, our_source: Path, tmp_path: Path, trace: Path
) -> None:
    venv = tmp_path / "venv"
    user, own = beside.new_venv(venv, lend=site)
    user.pip("install", "-q", "megatron-core==0.16.1")  # torch and numpy: found lent
    count, damaged = user.damaged(CORE)
    assert count > 400 and damaged == []
    assert (own / "megatron/core/__init__.py").is_file()

    user.pip("install", "-q", our_source)
    assert user.damaged(CORE) == (count, [])
    home, found = json.loads(user.code(_IMPORTS).splitlines()[-1])
    assert home.startswith("megatron.core.inference")
    assert found == {
        "megatron.core": str(own / "megatron/core/__init__.py"),
        "megatron.core.telemetry": str(own / "megatron/core/telemetry/__init__.py"),
        "megatron.trace_format": str(own / "megatron/trace_format/__init__.py"),
        "megatron.trace": str(own / "megatron/trace/__init__.py"),
    }
    user.trace_works(trace)

    user.pip("uninstall", "-y", OURS)
    assert user.damaged(CORE) == (count, [])
    home, found = json.loads(user.code(_IMPORTS).splitlines()[-1])
    assert home.startswith("megatron.core.inference")
    assert found == {
        "megatron.core": str(own / "megatron/core/__init__.py"),
        "megatron.core.telemetry": None,
        "megatron.trace_format": None,
        "megatron.trace": None,
    }
    assert not (venv / "bin" / "megatron-trace").exists()
    assert sorted(p.name for p in (own / "megatron").iterdir()) == ["core"]
