"""The ``jsonl`` sink: OTLP/JSON lines appended to local files.

Spans go to the trace file, one ``ExportTraceServiceRequest`` per line;
metrics go to ``metrics.jsonl`` beside it, one ``ExportMetricsServiceRequest``
per line. That is the OpenTelemetry file-exporter format, so the files can be
kept with the checkpoint and replayed into any OTLP backend later.

Two properties matter more than speed:

* Appending never damages what is there. A resumed run appends to the same
  file; if the previous process was killed halfway through a line, the first
  write starts with a newline so that torn line stays one (unparsable) line
  and every line after it parses.
* Each export is one ``write`` of whole lines on an ``O_APPEND`` descriptor,
  with no user-space buffer, so a crash after ``export`` returns loses
  nothing, and ranks sharing a file (``all_ranks``) interleave whole lines:
  the torn-line check and the write happen under an exclusive ``flock`` on
  the file, so no process looks at, or writes into, a line another process
  is still writing.

And three that long jobs on shared filesystems need:

* A file moved or deleted under a running job (log rotation) is noticed at
  the next write and the path is opened again, as the standard library's
  ``WatchedFileHandler`` does: one ``stat`` per export batch, not per span.
* Ranks (or nodes) creating the same directory at once all succeed: a
  directory another process made between our check and our ``mkdir`` is
  theirs, used and never removed by us.
* A failing write (a full disk) is logged once with its cause; later ones
  are only counted (:class:`ExportFailures`), so a long run does not log a
  traceback per export, and the totals are reported at shutdown. The part
  of a line such a write left is cut off again, so readers never mistake
  it for a killed process's torn write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from megatron.core.telemetry._otlp_json import encode_metrics, encode_spans
from megatron.trace_format.files import metrics_file_for
from megatron.trace_format.words import counted

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks, single-writer files only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ExportFailures",
    "JsonlFile",
    "JsonlMetricExporter",
    "JsonlSpanExporter",
    "metrics_file_for",
]

_logger = logging.getLogger(__name__)

# Read access only for peeking at the last byte (a torn line); writes always append.
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class JsonlFile:
    """An append-only file of JSON lines, safe to share between threads.

    Fork behaviour: a forked child inherits the descriptor, but writes from
    the child are dropped (``write_lines`` returns ``False``) without touching
    the lock, which a parent thread may have held at fork time. The child
    (a dataloader worker) is not an exporting process.
    """

    def __init__(self, path: Path, fd: int, created: Sequence[Path] = ()) -> None:
        self.path = path
        self._fd: int | None = fd
        # What ``open`` created (directories outermost first, then possibly
        # the file), so ``discard`` can undo a setup that fails later on.
        self._created = tuple(created)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: Torn last lines (a killed writer's) this file sealed with a newline.
        self.torn_lines_sealed = 0
        # Set once flock fails on this file's filesystem: later writes go unlocked.
        self._unlockable = False

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> JsonlFile:
        """Open ``path`` for appending, creating missing parent directories.

        Raises:
            OSError: the directory or the file cannot be created or written.
                Directories created by this call are removed again first, so
                a failed open leaves the filesystem as it found it.
        """
        path = Path(path)
        created = _make_parents(path.parent)
        try:
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory", str(path))
            existed = path.exists()
            fd = os.open(path, _OPEN_FLAGS, 0o644)
        except OSError:
            _remove_created(created)
            raise
        return cls(path, fd, created if existed else [*created, path])

    @property
    def closed(self) -> bool:
        return self._fd is None

    def write_lines(self, records: Sequence[Any]) -> bool:
        """Append each record as one JSON line, all in a single ``write``.

        Returns ``False`` when nothing was written (closed, or a forked child).
        Raises ``OSError`` on a write failure and ``ValueError`` for a record
        that is not JSON-serializable.
        """
        if not records or os.getpid() != self._pid:
            return False
        payload = b"".join(
            json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
                "utf-8"
            )
            + b"\n"
            for record in records
        )
        with self._lock:
            fd = self._fd
            if fd is None:
                return False
            fd = self._reopen_if_replaced(fd)
            with self._file_lock(fd):
                # Under the lock no other writer is mid-line, so the last byte
                # is either a finished line's newline or a killed writer's tear.
                size = os.fstat(fd).st_size
                sealed = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
                if sealed:
                    payload = b"\n" + payload
                    self.torn_lines_sealed += 1
                view = memoryview(payload)
                try:
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                except OSError:
                    if self._drop_partial_write(fd, len(payload) - len(view)) and sealed:
                        self.torn_lines_sealed -= 1  # the seal went too; the next write seals
                    raise
        return True

    @contextlib.contextmanager
    def _file_lock(self, fd: int) -> Iterator[None]:
        """Hold an exclusive advisory lock on the file around one seal check and write.

        Without it, another process's append can be in flight while this one
        looks at the last byte: a multi-page ``write`` grows the file page by
        page, so the byte read is the middle of that line, this process takes
        it for a torn line and prepends a newline, which lands after the
        other line's end as a blank line. Every writer of these files takes
        the lock, so no process ever looks at or writes into a line another
        process is writing. The kernel drops the lock of a killed process.

        A filesystem without ``flock`` (Lustre mounted without ``-o flock``)
        gets one warning and unlocked writes, as before; see the README.
        """
        if self._unlockable or fcntl is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            self._unlockable = True
            _logger.warning(
                "Cannot lock %s (%s): ranks appending to it at once may leave blank "
                "lines; use per-rank files on this filesystem",
                self.path,
                _cause(exc),
            )
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    @staticmethod
    def _drop_partial_write(fd: int, written: int) -> bool:
        """Cut off the part of a line a failed write left (a full disk), if it is last.

        A reader would take it for a torn write, a killed process's last
        line, which is not what happened. Only done while nothing was
        appended after it (the file ends where this descriptor's write did).
        Returns whether the bytes were removed.
        """
        if not written:
            return False
        try:
            end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: where our last write ended
            if os.fstat(fd).st_size != end:
                return False
            os.ftruncate(fd, end - written)
        except OSError:
            return False
        return True

    def _reopen_if_replaced(self, fd: int) -> int:
        """The descriptor for what is at ``self.path`` now.

        Called with the thread lock held, once per write (one export batch).

        When the file behind ``fd`` is no longer the one at the path (moved
        or deleted by log rotation), open the path again, creating it and its
        directories; otherwise every later write would go to a file no one
        will read. If the path cannot be opened, the ``OSError`` fails this
        export (counted by :class:`ExportFailures`), and the next one retries.
        """
        current = os.fstat(fd)
        try:
            here = os.stat(self.path)
            if (here.st_dev, here.st_ino) == (current.st_dev, current.st_ino):
                return fd
        except FileNotFoundError:
            pass
        _make_parents(self.path.parent)
        reopened = os.open(self.path, _OPEN_FLAGS, 0o644)
        os.close(fd)
        self._fd = reopened
        self._created = ()  # what a rotation left behind is not ours to discard
        return reopened

    def discard(self) -> None:
        """Close, and remove what ``open`` created if nothing was written to it.

        For a setup that fails after this file was opened: it should leave
        no trace on disk.
        """
        self.close()
        created = list(self._created)
        if created and created[-1] == self.path:
            try:
                if self.path.stat().st_size == 0:
                    self.path.unlink()
            except OSError:
                return
            created.pop()
        _remove_created(created)

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _make_parents(directory: Path) -> list[Path]:
    """``mkdir -p directory``; returns the directories it created, outermost first."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    created: list[Path] = []
    try:
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                # Another rank made it between our check and our mkdir: use
                # it, and never remove it. A file in the way is still an error.
                if not path.is_dir():
                    raise
                continue
            created.append(path)
    except OSError:
        _remove_created(created)
        raise
    return created


def _remove_created(created: Sequence[Path]) -> None:
    """Remove directories (and files) created by this module, innermost first."""
    for path in reversed(created):
        try:
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        except OSError:
            break


@dataclass
class ExportFailures:
    """Exports that did not reach the file, and what they carried.

    The first failure is logged with its cause (``No space left on device``)
    and no traceback; later ones are only counted, and :meth:`report` gives
    the totals for the shutdown log and the end-of-run summary.
    """

    kind: str = "span"  # or "metric", "log record"
    exports: int = 0
    items: int = 0
    first_cause: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, path: Path, items: int, exc: BaseException) -> None:
        with self._lock:
            self.exports += 1
            self.items += items
            first = self.first_cause is None
            if first:
                self.first_cause = _cause(exc)
        if first:
            _logger.warning(
                "Could not write %ss to %s: %s; later failures are counted and "
                "reported at shutdown",
                self.kind,
                path,
                self.first_cause,
            )

    def report(self) -> str | None:
        """One line with the totals, or None when nothing failed."""
        if not self.exports:
            return None
        line = f"{counted(self.exports, self.kind + ' export')} failed"
        if self.kind != "metric":  # a metric export carries totals the next one repeats
            line += f", {self.items} {self.kind}s lost"
        return f"{line} (first cause: {self.first_cause})"


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class JsonlSpanExporter(SpanExporter):
    """Writes each batch of spans as one OTLP/JSON line."""

    def __init__(self, file: JsonlFile) -> None:
        self._file = file
        self.failures = ExportFailures("span")

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            self._file.write_lines([encode_spans(spans)])
        except (OSError, ValueError, TypeError) as exc:
            self.failures.record(self._file.path, len(spans), exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered: every export is one unbuffered write

    def shutdown(self) -> None:
        self._file.close()


class JsonlMetricExporter(MetricExporter):
    """Writes each metrics collection as one OTLP/JSON line.

    Cumulative temporality (the SDK default): every line is self-contained,
    so the last line of a killed run still carries the run's totals.
    """

    def __init__(self, file: JsonlFile) -> None:
        super().__init__()
        self._file = file
        self.failures = ExportFailures("metric")

    @property
    def path(self) -> Path:
        return self._file.path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            request = encode_metrics(metrics_data)
            if request:
                self._file.write_lines([request])
        except (OSError, ValueError, TypeError) as exc:
            self.failures.record(self._file.path, 0, exc)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._file.close()
