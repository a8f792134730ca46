"""A Megatron-LM source checkout on ``PYTHONPATH`` beside the installed packages (issue 30).

Megatron-LM runs from its checkout: ``megatron`` is a namespace there, and
``megatron/core`` and ``megatron/training`` are regular packages. Python joins
every ``megatron`` folder on the path into one namespace, but a regular
package is found whole, at the first place on the path that has one, and
beats a namespace portion wherever that lies. So the checkout owns
``megatron.core`` and ``megatron.training`` (with every module under them,
ours in ``megatron/core/telemetry`` included) from first place, and
``megatron.core`` from anywhere when megatron-core is not installed (ours is
a namespace portion). ``megatron.trace`` and ``megatron.trace_format`` are ours
alone and import neither,
so ``megatron-trace`` works in every case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Beside


def test_a_checkout_first_owns_megatron_core_and_training(
    beside: Beside, checkout: Path, site: Path, trace: Path
) -> None:
    found = beside.resolve(
        "megatron.core.parallel_state",
        "megatron.training.training",
        "megatron.core.telemetry",
        "megatron.training.telemetry_spans",
        "megatron.trace_format.semconv",
        "megatron.trace.cli.main",
        pythonpath=[checkout],
    )
    assert found == {
        "megatron.core.parallel_state": str(checkout / "megatron/core/parallel_state.py"),
        "megatron.training.training": str(checkout / "megatron/training/training.py"),
        # shadowed with the rest of site-packages' megatron.core and megatron.training
        "megatron.core.telemetry": None,
        "megatron.training.telemetry_spans": None,
        "megatron.trace_format.semconv": str(site / "megatron/trace_format/semconv.py"),
        "megatron.trace.cli.main": str(site / "megatron/trace/cli/main.py"),
    }
    beside.trace_works(trace, pythonpath=[checkout])


def test_a_checkout_last_is_shadowed_and_megatron_trace_works(
    beside: Beside, checkout: Path, site: Path, trace: Path
) -> None:
    # site-packages (megatron-core and us) ahead of the checkout
    path = [site, checkout]
    found = beside.resolve(
        "megatron.core.parallel_state",
        "megatron.training.training",
        "megatron.core.telemetry",
        "megatron.trace.cli.main",
        pythonpath=path,
    )
    assert found == {
        "megatron.core.parallel_state": str(site / "megatron/core/parallel_state.py"),
        "megatron.training.training": str(site / "megatron/training/training.py"),
        "megatron.core.telemetry": str(site / "megatron/core/telemetry/__init__.py"),
        "megatron.trace.cli.main": str(site / "megatron/trace/cli/main.py"),
    }
    beside.trace_works(trace, pythonpath=path)


def test_without_megatron_core_a_checkout_anywhere_owns_megatron_core(
    beside: Beside, site: Path, our_source: Path, checkout: Path, tmp_path: Path, trace: Path
) -> None:
    # How most Megatron-LM users run: a checkout, and us installed (no megatron-core).
    # Our megatron/core is a namespace portion, and a regular package found anywhere
    # on the path beats one: the checkout's megatron.core wins even from behind.
    user, own = beside.new_venv(tmp_path / "venv", lend=site)
    user.pip("install", "-q", our_source)
    names = (
        "megatron.core.parallel_state",
        "megatron.core.telemetry",
        "megatron.training.training",
        "megatron.trace.cli.main",
    )
    assert user.resolve(*names, pythonpath=[own, checkout]) == {
        "megatron.core.parallel_state": str(checkout / "megatron/core/parallel_state.py"),
        "megatron.core.telemetry": None,
        # our trainer is found first, but what it imports of megatron.core.telemetry is not
        "megatron.training.training": "needs megatron.core.telemetry",
        "megatron.trace.cli.main": str(own / "megatron/trace/cli/main.py"),
    }
    assert user.resolve(*names, pythonpath=[checkout]) == {
        "megatron.core.parallel_state": str(checkout / "megatron/core/parallel_state.py"),
        "megatron.core.telemetry": None,
        "megatron.training.training": str(checkout / "megatron/training/training.py"),
        "megatron.trace.cli.main": str(own / "megatron/trace/cli/main.py"),
    }
    user.trace_works(trace, pythonpath=[checkout])
    user.trace_works(trace, pythonpath=[own, checkout])


# Imports every module of megatron.trace, runs three commands in this process,
# then prints which megatron modules it has loaded.
_EVERYTHING = """
import importlib, json, pkgutil, sys
import megatron.trace
from megatron.trace.cli.main import main
trace, out = sys.argv[1:]
for module in pkgutil.walk_packages(megatron.trace.__path__, "megatron.trace."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
statuses = [
    main(["check", trace]),
    main(["report", "--json", trace]),
    main(["export", "--format", "chrome", "-o", out, trace]),
]
print(json.dumps([statuses, sorted(m for m in sys.modules if m.startswith("megatron"))]))
"""


@pytest.mark.parametrize("with_checkout", [False, True], ids=["installed", "checkout-first"])
def test_megatron_trace_loads_nothing_of_megatron_core_or_training(
    beside: Beside, checkout: Path, trace: Path, tmp_path: Path, with_checkout: bool
) -> None:
    out = beside.code(
        _EVERYTHING,
        trace,
        tmp_path / "chrome.json",
        pythonpath=[checkout] if with_checkout else [],
    )
    statuses, loaded = json.loads(out.splitlines()[-1])
    assert statuses == [0, 0, 0]
    assert (tmp_path / "chrome.json").stat().st_size > 0
    # the walk reached every room, down to the pictures
    assert {"megatron.trace.render.timeline.write", "megatron.trace._store.spill"} <= set(loaded)
    assert [m for m in loaded if m.startswith(("megatron.core", "megatron.training"))] == []
