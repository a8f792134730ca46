"""The one error type of ``megatron-trace``: what went wrong, and the exit status it means.

The library raises a :class:`TraceError` (or a subclass) with a message that
names the file, flag or value at fault and what would be valid; the command
line (:mod:`megatron.trace.cli.main`) alone turns it into one line,
``megatron-trace COMMAND: error: MESSAGE``, and :attr:`TraceError.exit_code`.
Nothing else in the package prints an error or picks an exit status.

Exit statuses: 0 success; 1 a finding (``check`` found a violation); 2 bad
input or an environment that cannot do the work (a file missing, unreadable or
damaged, no spans, a bad option value, a missing optional package, an output
that cannot be written); 141 (128 + SIGPIPE), silently, when the reader of
the output closed the pipe early.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "CompressedTraceError",
    "MissingExtraError",
    "NoSpansError",
    "SpansReadTwiceError",
    "SpillError",
    "TraceError",
    "TraceFileDamaged",
    "TraceInputError",
    "TraceOutputError",
    "WindowError",
]


class TraceError(Exception):
    """Anything ``megatron-trace`` cannot do; the message is the whole line to print."""

    exit_code: int = 2


class TraceInputError(TraceError, ValueError):
    """A trace file that cannot be read, or an option value that names nothing."""


class NoSpansError(TraceInputError):
    """The files hold no span: nothing to check, report, draw or export."""

    def __init__(self, files: Any) -> None:
        names = [str(files)] if isinstance(files, (str, Path)) else [str(f) for f in files]
        super().__init__(f"no spans in {', '.join(names)}")
        self.files = names

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.files,))


class TraceFileDamaged(TraceInputError):
    """A line that is neither a whole export request nor a torn write."""

    def __init__(self, path: Path | str, line: int, reason: str) -> None:
        super().__init__(f"{path}: line {line} is damaged ({reason})")
        self.path = Path(path)
        self.line = line
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # so it crosses a process pool intact
        return (type(self), (self.path, self.line, self.reason))


class CompressedTraceError(TraceInputError):
    """A compressed trace file that cannot be decompressed here (the message says why)."""


class WindowError(TraceInputError):
    """A ``--since`` / ``--until`` / ``--ranks`` value that names nothing."""


class SpansReadTwiceError(TraceInputError):
    """The files hold one span twice (one file named twice, or a job's own file with a
    receiver's copy of it): every figure would count its time twice."""


class SpillError(TraceError, RuntimeError):
    """What a read spilled could not be read back (a write that fails keeps it in memory)."""


class MissingExtraError(TraceError):
    """An optional package a command needs is not installed; the message names the extra."""

    def __init__(self, what: str, package: str, extra: str = "trace") -> None:
        super().__init__(
            f"{what} needs the {package} package: pip install 'megatron-telemetry-spans[{extra}]'"
        )
        self.what, self.package, self.extra = what, package, extra

    def __reduce__(self) -> tuple[Any, ...]:
        # so it crosses a process pool or a Dask cluster intact (a worker without zstandard)
        return (type(self), (self.what, self.package, self.extra))


class TraceOutputError(TraceError):
    """The output file cannot be written (the message names it and why)."""
