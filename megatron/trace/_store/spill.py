"""Where a read puts what it would otherwise hold in memory: one anonymous temporary file.

A week of a many-rank job holds tens of millions of iterations and hundreds of
thousands of structural records; the trace model keeps only the newest of
them in memory and writes the rest out here as *blocks*
(:mod:`megatron.trace._store.columns`, :mod:`megatron.trace._store.record_log`), keeping
only where each block lies.

The file is deleted as it is created (``tempfile.TemporaryFile``, ``O_TMPFILE``
where there is one), so nothing is left behind whatever ends the process. It
is read and written with ``os.pread``/``os.pwrite`` (no shared file offset), so
processes forked from the one that wrote it (the export's workers) read it too;
a process writes only to a file of its own (:func:`store` checks the pid).
The file is held weakly here and strongly by its blocks: it closes, and its
disk space is freed, with the last block of a read, so a long-lived process
that reads trace after trace does not pile files up.

The one spill policy of a read (the iteration columns, the record log, the
JSON columns and ``check``'s span ids alike): where no temporary file can be
written (``TMPDIR`` read-only or full), or there is no positioned I/O (not
POSIX), the read goes on with its data in memory, as for a small trace, and
says so once (:func:`unwritable`: one warning line naming ``TMPDIR``). A
read is never refused for want of a temporary file; it may then need more
memory.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any

__all__ = ["Store", "store", "unwritable", "writable", "write"]


class Store:
    """One process's temporary file of blocks, appended to and read by offset."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # open for the process's life (closed, and so freed, when it exits)
        self._file = tempfile.TemporaryFile(prefix="megatron-trace-")  # noqa: SIM115
        self._end = 0
        self._lock = threading.Lock()  # readers on a thread pool share the store

    def write(self, buffers: Sequence[Any]) -> int:
        """Append the buffers (anything with the buffer protocol) one after another;
        returns where the first begins."""
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        with self._lock:
            offset = self._end
            self._end += sum(len(view) for view in views)
        at, fd = offset, self._file.fileno()
        for view in views:
            written = 0
            while written < len(view):  # (a short write is legal: go on where it stopped)
                written += os.pwrite(fd, view[written:], at + written)
            at += len(view)
        return offset

    def read(self, at: int, size: int) -> bytes:
        """The ``size`` bytes stored at byte ``at``."""
        data = os.pread(self._file.fileno(), size, at)
        if len(data) != size:  # the file is ours and was written whole: never expected
            raise OSError(f"megatron-trace spill file: read {len(data)} of {size} bytes at {at}")
        return data


# The store blocks are written to now (held weakly: see the module docstring).
_STORE: weakref.ref[Store] | None = None
_STORE_LOCK = threading.Lock()
# Set when no temporary file could be written, or where there is no positioned I/O:
# the callers then keep their data in memory, as they would for a small trace.
_UNWRITABLE: list[OSError] = (
    [] if hasattr(os, "pread") and hasattr(os, "pwrite") else [OSError("no os.pwrite")]
)


def store() -> Store:
    """This process's store (a forked child makes its own before writing)."""
    global _STORE
    with _STORE_LOCK:
        current = _STORE() if _STORE is not None else None
        if current is None or current.pid != os.getpid():
            current = Store()
            _STORE = weakref.ref(current)
        return current


_logger = logging.getLogger("megatron.trace")


def writable() -> bool:
    """Whether a read may still try to spill (no temporary file has failed it yet)."""
    return not _UNWRITABLE


def unwritable(error: OSError) -> None:
    """Record that temporary files cannot be written here; warn once, naming ``TMPDIR``."""
    first = not _UNWRITABLE
    _UNWRITABLE.append(error)
    if first:
        _logger.warning(
            "megatron-trace: warning: cannot write temporary files in %s (%s): keeping the "
            "read in memory; set TMPDIR to a writable directory with room to bound it",
            tempfile.gettempdir(),
            error.strerror or error,
        )


def write(buffers: Sequence[Any]) -> tuple[Store, int] | None:
    """Write the buffers to this process's store: the store and where they begin, or
    None when nothing can be written here (tried once: then the data stays in memory)."""
    if _UNWRITABLE:
        return None
    try:
        current = store()
        return current, current.write(buffers)
    except OSError as error:  # no room for a temporary file
        unwritable(error)
        return None
