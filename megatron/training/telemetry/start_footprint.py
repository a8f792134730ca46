"""What a start created on disk, so a start that fails can leave the disk as it found it.

A job that stops on bad input before it trains (a corrupt checkpoint under
``--load``, a trace file it cannot write...) must not leave an empty
``--save`` tree, or telemetry files under it, behind: the next attempt, or a
colleague, would find a directory that looks like a started job.

Most checks run before anything is created (``arguments.py``; its ``--save``
probe removes what it made). What cannot be checked without starting is the
checkpoint itself, read after telemetry has opened its files. So before the
job creates anything, :meth:`StartFootprint.before` notes which of the paths
it may create (``--save``, the telemetry files, and their parent
directories) do not exist yet; :meth:`StartFootprint.undo` removes exactly
those, innermost first: files it finds there, and directories only when they
are empty (so anything else written into them meanwhile stays). A path that
existed before is never touched: a trace file the job appends to keeps the
failed start's spans, which read as ``failed``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from megatron.core.telemetry import TelemetryConfig
from megatron.core.telemetry.logs import logs_file_for
from megatron.trace_format.files import metrics_file_for

__all__ = ["StartFootprint", "telemetry_files"]

_log = logging.getLogger(__name__)


class StartFootprint:
    """The paths a start may create that did not exist before it, deepest first."""

    def __init__(self, missing: Iterable[Path]) -> None:
        self.missing = sorted(set(missing), key=lambda p: len(p.parts), reverse=True)

    @classmethod
    def before(cls, paths: Iterable[str | os.PathLike[str] | None]) -> StartFootprint:
        """Note which of ``paths`` (and of their parents) do not exist yet; None is skipped."""
        missing: list[Path] = []
        for path in paths:
            if path is None:
                continue
            for candidate in (Path(path), *Path(path).parents):
                if os.path.lexists(candidate):
                    break
                missing.append(candidate)
        return cls(missing)

    def undo(self) -> list[Path]:
        """Remove what this start created of the noted paths; returns what was removed.

        Never raises: a path that cannot be removed is left and logged at
        debug level (the start's own error is what the user must see).
        """
        removed: list[Path] = []
        for path in self.missing:
            try:
                if path.is_symlink() or path.is_file():
                    path.unlink()
                elif path.is_dir():
                    path.rmdir()  # only when empty: nothing but ours was in it
                else:
                    continue
            except OSError as exc:
                _log.debug("left %s in place: %s", path, exc)
                continue
            removed.append(path)
        return removed


def telemetry_files(config: TelemetryConfig) -> list[Path]:
    """The files the ``jsonl`` exporter of ``config`` opens at setup (none for other exporters)."""
    if not config.enabled or config.exporter != "jsonl":
        return []
    trace_file = Path(config.trace_file)
    files = []
    if config.traces_enabled:
        files.append(trace_file)
    if config.metrics_enabled:
        files.append(metrics_file_for(trace_file))
    if config.logs_enabled:
        files.append(logs_file_for(trace_file))
    return files
