"""The spans of one or more trace files, as a source that can be read more than once.

The pictures read their input in passes (first learn the lanes, then draw or
write), so what they take is not a list of spans but a function that starts a
fresh pass over the files: memory stays independent of the files' size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from megatron.trace.otlp.reader import iter_spans
from megatron.trace_format.errors import TraceInputError

__all__ = ["FileSpans", "SpanSource", "TraceInputError", "reading", "span_source"]

SpanSource = Callable[[], Iterator[dict[str, Any]]]


class FileSpans:
    """The spans of some trace files: call it for a fresh pass; ``paths`` for the fast readers."""

    def __init__(self, paths: Sequence[Path | str]) -> None:
        self.paths = [Path(path) for path in paths]

    def __call__(self) -> Iterator[dict[str, Any]]:
        # The base layer's streaming reader: torn writes skipped, damage raised by line.
        for path in self.paths:
            with reading(path):
                yield from iter_spans(path)


@contextlib.contextmanager
def reading(path: Path | None = None) -> Iterator[None]:
    """Turn the errors of reading ``path`` (default: whichever file the error names) into
    :class:`TraceInputError` (one line, exit 2)."""
    try:
        yield
    except OSError as exc:
        raise TraceInputError(f"{path or exc.filename}: cannot read it: {exc}") from exc
    except ValueError as exc:  # TraceFileDamaged names the file and line
        raise TraceInputError(str(exc)) from exc


def span_source(paths: Sequence[Path]) -> FileSpans:
    """A re-startable pass over the spans of ``paths``, in order; checks the files exist."""
    for path in paths:
        if not Path(path).is_file():
            raise TraceInputError(f"{path}: no such trace file (give a run's traces.jsonl)")
    return FileSpans(paths)
