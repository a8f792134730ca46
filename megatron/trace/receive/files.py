"""Where a received export request goes: a folder per job, in it one per rank, a line a request.

A request may carry the spans (or points, or log records) of several
processes, even of several jobs; each ``resource*`` entry goes to the
folder of the process its resource names, ``OUT/<job>/<rank>/``
(:func:`job_folder`, :func:`rank_folder`), and the entries bound for one
folder become one line there: a whole OTLP/JSON export request, as the
OTLP file exporter and this project's own exporter write them.

**The job** is the first of ``nemo.lens.job_uuid`` (but the one Megatron-LM gives every
job off Slurm), ``megatron.run_id``, ``nemo.run.id``, ``slurm.job.id`` and
``service.instance.id`` less its ``-rank<N>`` the resource carries (:func:`job_id`;
the rule is :mod:`megatron.trace_format.jobs`'s, which the reader applies too).

``service.name`` is not one: every Megatron-LM job is ``megatron-lm``. A
process that names none of these gets a folder of its own, ``process-<hash>``
of its host and pid (``unidentified`` when it names neither), never another
job's. A resumed job (a new launch with the same job id: the same Slurm job,
or the same run id given again) lands in its earlier launches' folder, so
``report`` reads them as the job's incarnations.

**Folder names** are safe whatever a client sends (:func:`safe_name`): only
``A-Za-z0-9._-``, at most :data:`NAME_CHARS` characters, never ``.`` or
``..``; a name that had to be changed ends in a hash of the original, so two
ids never share a folder (nor an id and a process naming none). A client
cannot make the receiver create more than ``max_folders`` folders (job and
rank folders both count, those already under ``OUT`` too): a request that
would is refused whole (:class:`FolderLimitError`).

**A request sent twice is written once.** An exporter whose acknowledgement
was lost (the receiver killed after writing, before answering) sends the same
request again, and the receiver turns it into the same line. So each file
remembers the digests of its last :data:`RECENT_LINES` lines (read back from
the file's tail when a restarted receiver first writes to it), and a line
equal to one of them is acknowledged and not written again (counted in
``duplicates``): ``report`` counts each span once.

Appending never damages what a file holds: each line is one ``write`` on a
descriptor opened for appending, under a lock (the gRPC and HTTP servers
write from several threads); a file whose last line was cut short (a
receiver or writer killed mid-line) gets a newline first, so the torn line
stays the one torn line the reader skips, and the new one is whole.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from megatron.trace_format.errors import TraceInputError, TraceOutputError
from megatron.trace_format.jobs import JOB_KEYS, UNPLACED_JOB_UUID, job_of
from megatron.trace_format.semconv import (
    DL_RANK,
    HOST_NAME,
    PROCESS_PID,
    SERVICE_INSTANCE_ID,
)

__all__ = [
    "DEFAULT_MAX_FOLDERS",
    "JOB_KEYS",
    "KINDS",
    "NAME_CHARS",
    "RECENT_LINES",
    "UNPLACED_JOB_UUID",
    "FolderLimitError",
    "RankFiles",
    "job_folder",
    "job_id",
    "rank_folder",
    "safe_name",
]

#: Signal -> (the request's list of resource entries, the file each rank's go to).
KINDS: dict[str, tuple[str, str]] = {
    "traces": ("resourceSpans", "traces.jsonl"),
    "metrics": ("resourceMetrics", "metrics.jsonl"),
    "logs": ("resourceLogs", "logs.jsonl"),
}

#: The longest folder name made from what a client sent.
NAME_CHARS = 96
#: The most folders one receiver's ``OUT`` holds by default (job and rank folders).
DEFAULT_MAX_FOLDERS = 10_000

#: The lines per file whose digests are remembered, to write a resent request once: a
#: retry comes within the exporter's timeout (10 s by default), a few lines later at most.
RECENT_LINES = 64
#: How much of a file's tail a restarted receiver reads back for those digests.
TAIL_BYTES = 16 << 20

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HASHED = re.compile(r"-[0-9a-f]{12}$")
_UNIDENTIFIED = "unidentified"


class FolderLimitError(TraceInputError):
    """A request would make the receiver create more folders than it may."""


def _attributes(resource: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in resource.get("attributes") or ():
        value = pair.get("value") or {}
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                found[pair.get("key")] = value[kind]
                break
    return found


def safe_name(text: str) -> str:
    """``text`` as a folder name: itself when it is one already (``A-Za-z0-9._-``, not
    starting with a dot, at most :data:`NAME_CHARS`), else its safe part and a hash of it.

    A name made with a hash ends in ``-`` and 12 hex digits, and a name kept as sent never
    does (such a one is hashed too), nor is it ``unidentified``: so what two different ids
    give never coincides, whatever a client sends (short of a 48-bit hash collision)."""
    cleaned = _UNSAFE.sub("_", text).strip("._-")
    if (
        cleaned == text
        and 0 < len(text) <= NAME_CHARS
        and not _HASHED.search(text)
        and text != _UNIDENTIFIED
    ):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{cleaned[: NAME_CHARS - 13]}-{digest}" if cleaned else f"id-{digest}"


def job_id(resource: Mapping[str, Any]) -> str | None:
    """The job the process of ``resource`` (OTLP/JSON) belongs to, as the module docstring
    orders the attributes (:func:`~megatron.trace_format.jobs.job_of`, which the reader
    applies too); ``None`` when it names none."""
    return job_of(_attributes(resource))


def job_folder(resource: Mapping[str, Any]) -> str:
    """The folder name of the job of ``resource``: its :func:`job_id` made safe, else
    ``process-<hash>`` of the process's host and pid, else ``unidentified``."""
    found = job_id(resource)
    if found is not None:
        return safe_name(found)
    attributes = _attributes(resource)
    host, pid = attributes.get(HOST_NAME), attributes.get(PROCESS_PID)
    if host is None and pid is None:
        return _UNIDENTIFIED
    digest = hashlib.sha256(f"{host}\0{pid}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"process-{digest[:12]}"


def rank_folder(resource: Mapping[str, Any]) -> str:
    """The folder name, inside its job's, for the process that ``resource`` describes.

    The attributes the reader tells ranks apart by, in its order: ``dl.rank``
    (this project's trainer and nemo-lens both set it) gives ``rank<N>``;
    else ``service.instance.id`` (``<run id>-rank<N>``), made safe for a file
    name; else ``unknown``: one process that says nothing of itself.
    """
    attributes = _attributes(resource)
    rank = attributes.get(DL_RANK)
    if rank is not None and re.fullmatch(r"-?\d{1,18}", str(rank)):
        return f"rank{int(rank)}"
    instance = attributes.get(SERVICE_INSTANCE_ID)
    if instance:
        return safe_name(str(instance))
    return "unknown"


class RankFiles:
    """Appends received requests under ``out``, a folder per job, in it one per rank
    (thread-safe); at most ``max_folders`` folders under ``out``, those there already too."""

    def __init__(self, out: Path, max_folders: int = DEFAULT_MAX_FOLDERS) -> None:
        self.out = out
        self.max_folders = max_folders
        self._lock = threading.Lock()
        self._fds: dict[Path, int] = {}
        #: Lines written per file, for the summary a stopped receiver prints.
        self.lines: dict[Path, int] = {}
        #: The folders under ``out`` (relative: ``job`` and ``job/rank``), counted once.
        self._folders: set[Path] | None = None
        #: Resource entries refused for want of a folder, for the summary.
        self.refused = 0
        #: Lines not written again: a resent request's (see the module docstring).
        self.duplicates = 0
        self._recent: dict[Path, collections.OrderedDict[bytes, None]] = {}

    def _known(self) -> set[Path]:
        if self._folders is None:
            found: set[Path] = set()
            if self.out.is_dir():
                for job in self.out.iterdir():
                    if job.is_dir():
                        found.add(Path(job.name))
                        found.update(Path(job.name, r.name) for r in job.iterdir() if r.is_dir())
            self._folders = found
        return self._folders

    def write(self, kind: str, request: Mapping[str, Any]) -> list[Path]:
        """Append ``request`` (an OTLP/JSON export request of ``kind``, a key of
        :data:`KINDS`) split by job and rank; the files written, in order. A request that
        would need more folders than allowed writes nothing: :class:`FolderLimitError`."""
        key, name = KINDS[kind]
        by_folder: dict[Path, list[Any]] = {}
        for entry in request.get(key) or ():
            resource = entry.get("resource") or {}
            folder = Path(job_folder(resource), rank_folder(resource))
            by_folder.setdefault(folder, []).append(entry)
        with self._lock:
            known = self._known()
            new = {f for folder in by_folder for f in (folder.parent, folder) if f not in known}
            if new and len(known) + len(new) > self.max_folders:
                self.refused += sum(len(v) for k, v in by_folder.items() if k in new)
                raise FolderLimitError(
                    f"{self.out} holds {len(known)} folders, the most --max-folders allows "
                    f"({self.max_folders}): refused a request for {len(new)} more "
                    f"({', '.join(sorted(map(str, new))[:3])})"
                )
            known.update(new)  # reserved now, so threads writing at once cannot overshoot
        written = []
        for folder, entries in by_folder.items():
            path = self.out / folder / name
            line = json.dumps({key: entries}, separators=(",", ":")) + "\n"
            self._append(path, line.encode())
            written.append(path)
        return written

    def _append(self, path: Path, data: bytes) -> None:
        digest = _digest(data)
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = self._open(path)
            recent = self._recent[path]
            if digest in recent:
                self.duplicates += 1
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as error:
                raise TraceOutputError(f"cannot write {path}: {error.strerror or error}") from error
            self.lines[path] = self.lines.get(path, 0) + 1
            _remember(recent, digest)

    def _open(self, path: Path) -> int:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as error:
            raise TraceOutputError(f"cannot write {path}: {error.strerror or error}") from error
        size = os.fstat(fd).st_size
        recent: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        if size:
            with open(path, "rb") as existing:
                existing.seek(max(0, size - TAIL_BYTES))
                tail = existing.read()
            whole = tail.split(b"\n")[:-1]  # what follows the last newline is torn
            if size > TAIL_BYTES:
                whole = whole[1:]  # (the first one read may be a line's end only)
            for line in whole[-RECENT_LINES:]:
                _remember(recent, _digest(line + b"\n"))
            if not tail.endswith(b"\n"):
                os.write(fd, b"\n")  # end the torn line: ours starts on a line of its own
        self._recent[path] = recent
        return fd

    def files(self) -> Iterable[Path]:
        return sorted(self.lines)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._recent.clear()


def _digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=16).digest()


def _remember(recent: collections.OrderedDict[bytes, None], digest: bytes) -> None:
    recent[digest] = None
    if len(recent) > RECENT_LINES:
        recent.popitem(last=False)
