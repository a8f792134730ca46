"""What the trainer needs beyond what the reader and the lifecycle module need, said in one line.

The package installs without torch (``pip install megatron-telemetry-spans``
gives the reader, ``megatron-trace watch`` and the span lifecycle,
:mod:`megatron.training.telemetry_spans`); the trainer is the ``train``
extra. ``megatron-pretrain`` calls :func:`missing_for_trainer` before it
imports the training loop, so a missing torch is one line naming the extra,
not a traceback from deep inside the model's imports.

``--inprocess-restart`` needs NVIDIA Resiliency Extension, the ``inprocess``
extra: without it the flag is one line naming the extra
(:func:`missing_for_inprocess_restart`), and nothing else imports it.

It also finds the one broken install a Megatron-LM user meets:
megatron-core's ``megatron/core`` is a regular package, so once it is
installed, ``megatron.core.telemetry`` resolves only where pip merged this
project's files into that same folder (a regular install). An editable
install leaves them in the source tree, where ``megatron.core`` never looks;
:func:`join_core_telemetry` (run when :mod:`megatron.training` is imported)
points the import system at them, so the editable install works too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

#: The extra that installs the trainer's packages (pyproject.toml).
TRAIN_EXTRA = "megatron-telemetry-spans[train]"
#: The extra that installs NVIDIA Resiliency Extension, for ``--inprocess-restart``.
INPROCESS_EXTRA = "megatron-telemetry-spans[inprocess]"
#: This project's copy of the telemetry package, beside megatron/training/.
_OUR_TELEMETRY = Path(__file__).resolve().parent.parent / "core" / "telemetry"

__all__ = [
    "INPROCESS_EXTRA",
    "TRAIN_EXTRA",
    "join_core_telemetry",
    "missing_for_inprocess_restart",
    "missing_for_trainer",
]


def missing_for_trainer() -> str | None:
    """Why the trainer cannot start in this environment (one line), or None when it can."""
    if importlib.util.find_spec("torch") is None:
        return (
            f"the trainer needs torch, which is not installed: pip install '{TRAIN_EXTRA}' "
            "(reading traces and megatron-trace need no torch)"
        )
    return None


def missing_for_inprocess_restart() -> str | None:
    """Why ``--inprocess-restart`` cannot run here (one line), or None when it can."""
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        return (
            "--inprocess-restart needs NVIDIA Resiliency Extension (nvidia-resiliency-ext), "
            f"which is not installed: pip install '{INPROCESS_EXTRA}'"
        )
    return None


class _CoreTelemetryFinder(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core.telemetry`` in this project's tree when no other finder does.

    Last on ``sys.meta_path``, so a regular install (where the package lies in
    megatron-core's folder) or a source checkout never reaches it. Only the
    package itself is found here: its submodules follow from the spec's
    search location.
    """

    name = "megatron.core.telemetry"

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        init = _OUR_TELEMETRY / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[str(_OUR_TELEMETRY)]
        )


def join_core_telemetry() -> None:
    """Install the fallback finder once (idempotent; costs no import)."""
    if not any(isinstance(finder, _CoreTelemetryFinder) for finder in sys.meta_path):
        sys.meta_path.append(_CoreTelemetryFinder())
