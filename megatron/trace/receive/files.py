"""Where a received export request goes: one folder per rank, one line per request.

A request may carry the spans (or points, or log records) of several
processes; each ``resource*`` entry goes to the folder of the process its
resource names (:func:`rank_folder`), and the entries bound for one folder
become one line there: a whole OTLP/JSON export request, as the OTLP file
exporter and this project's own exporter write them.

Appending never damages what a file holds: each line is one ``write`` on a
descriptor opened for appending, under a lock (the gRPC and HTTP servers
write from several threads); a file whose last line was cut short (a
receiver or writer killed mid-line) gets a newline first, so the torn line
stays the one torn line the reader skips, and the new one is whole.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from megatron.trace_format.errors import TraceOutputError
from megatron.trace_format.semconv import DL_RANK, SERVICE_INSTANCE_ID

__all__ = ["KINDS", "RankFiles", "rank_folder"]

#: Signal -> (the request's list of resource entries, the file each rank's go to).
KINDS: dict[str, tuple[str, str]] = {
    "traces": ("resourceSpans", "traces.jsonl"),
    "metrics": ("resourceMetrics", "metrics.jsonl"),
    "logs": ("resourceLogs", "logs.jsonl"),
}

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _attributes(resource: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in resource.get("attributes") or ():
        value = pair.get("value") or {}
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                found[pair.get("key")] = value[kind]
                break
    return found


def rank_folder(resource: Mapping[str, Any]) -> str:
    """The folder name for the process that ``resource`` (OTLP/JSON) describes.

    The attributes the reader tells ranks apart by, in its order: ``dl.rank``
    (this project's trainer and nemo-lens both set it) gives ``rank<N>``;
    else ``service.instance.id`` (``<run id>-rank<N>``), made safe for a file
    name; else ``unknown``: one process that says nothing of itself.
    """
    attributes = _attributes(resource)
    rank = attributes.get(DL_RANK)
    if rank is not None and re.fullmatch(r"-?\d+", str(rank)):
        return f"rank{int(rank)}"
    instance = attributes.get(SERVICE_INSTANCE_ID)
    if instance:
        return _UNSAFE.sub("_", str(instance)).strip("._") or "unknown"
    return "unknown"


class RankFiles:
    """Appends received requests under ``out``, one folder per rank (thread-safe)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._fds: dict[Path, int] = {}
        #: Lines written per file, for the summary a stopped receiver prints.
        self.lines: dict[Path, int] = {}

    def write(self, kind: str, request: Mapping[str, Any]) -> list[Path]:
        """Append ``request`` (an OTLP/JSON export request of ``kind``, a key of
        :data:`KINDS`) split by rank; the files written, in order."""
        key, name = KINDS[kind]
        by_folder: dict[str, list[Any]] = {}
        for entry in request.get(key) or ():
            by_folder.setdefault(rank_folder(entry.get("resource") or {}), []).append(entry)
        written = []
        for folder, entries in by_folder.items():
            path = self.out / folder / name
            line = json.dumps({key: entries}, separators=(",", ":")) + "\n"
            self._append(path, line.encode())
            written.append(path)
        return written

    def _append(self, path: Path, data: bytes) -> None:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = self._open(path)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as error:
                raise TraceOutputError(f"cannot write {path}: {error.strerror or error}") from error
            self.lines[path] = self.lines.get(path, 0) + 1

    def _open(self, path: Path) -> int:
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as error:
            raise TraceOutputError(f"cannot write {path}: {error.strerror or error}") from error
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as existing:
                existing.seek(size - 1)
                if existing.read(1) != b"\n":
                    os.write(fd, b"\n")  # end the torn line: ours starts on a line of its own
        return fd

    def files(self) -> Iterable[Path]:
        return sorted(self.lines)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
