"""Following trace files as a job writes them: only what is new, across rotation.

``megatron-trace watch`` reads a job's files while it runs. Each file named is
one of two kinds:

* a **live** file (``traces.jsonl``): opened when it appears and followed
  through its open descriptor. Each poll reads what was appended since the
  last one and hands on its whole lines; a last line without its newline yet
  (a write in progress) waits for its rest. When the name comes to stand
  for another file (logrotate renamed it to ``traces.jsonl.1``, maybe
  compressed that, and the job started a new one), what is left of the old
  file is read through the descriptor first, whatever became of its name, and
  then the new file from its start; a file cut back in place (``copytruncate``)
  is read again from its start. Nothing is ever read twice.
* a **rotated** copy (compressed, or named ``….jsonl.N``, ``….N.gz``): whole,
  so read once, when first seen.

A file that is not there yet is waited for (:attr:`Follower.waiting` names it
once). The follower knows nothing of JSON: it yields ``(path, line number,
bytes)`` as :func:`megatron.trace.otlp.reader.iter_lines` does, numbered per
file (a new file after a rotation starts again at 1).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from megatron.trace_format.files import is_compressed, iter_lines

__all__ = ["Follower", "is_rotated_copy"]

_ROTATED = re.compile(r"\.\d+(\.(gz|zst|zstd))?$|\.(gz|zst|zstd)$")
#: At most this much is read from one file per poll, so one poll's memory stays bounded
#: (a big file already there is read over several polls).
CHUNK_BYTES = 16 << 20


def is_rotated_copy(path: Path) -> bool:
    """Whether ``path``'s name is a rotated copy's (``x.jsonl.1``, ``x.jsonl.2.gz``, ``x.zst``)."""
    return _ROTATED.search(path.name) is not None


@dataclass
class _Live:
    """One followed name: its open file, which file that is, and how far it was read."""

    path: Path
    file: IO[bytes] | None = None
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
    offset: int = 0
    line: int = 0  # lines handed on (or skipped as blank) so far
    partial: bytes = b""
    done: bool = False  # a rotated copy, read whole


@dataclass
class Follower:
    """Follows ``paths`` (see the module docstring); :meth:`poll` yields the new lines."""

    paths: list[Path]
    #: names not there yet, first seen missing at the last poll (the caller says so once)
    waiting: list[Path] = field(default_factory=list)
    #: (path, line number) of each last line a rotation cut off before its newline
    cut_off: list[tuple[Path, int]] = field(default_factory=list)
    _files: list[_Live] = field(default_factory=list)
    _announced: set[Path] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._files = [_Live(Path(path)) for path in self.paths]

    def close(self) -> None:
        for live in self._files:
            if live.file is not None:
                live.file.close()
                live.file = None

    def poll(self) -> Iterator[tuple[Path, int, bytes]]:
        """Every whole line appended since the last poll (at most a chunk per file)."""
        self.waiting = []
        for live in self._files:
            if live.done:
                continue
            if live.file is None and not self._open(live):
                continue
            yield from self._read(live)
            yield from self._check_rotation(live)

    def _open(self, live: _Live) -> bool:
        try:
            file = open(live.path, "rb")  # noqa: SIM115 (kept open across polls)
        except FileNotFoundError:
            if live.path not in self._announced:
                self._announced.add(live.path)
                self.waiting.append(live.path)
            return False
        status = os.fstat(file.fileno())
        head = file.read(4)
        file.seek(0)
        if is_compressed(head) or is_rotated_copy(live.path):
            file.close()
            live.done = True
            live.file = None
            return True
        live.file, live.identity = file, (status.st_dev, status.st_ino)
        live.offset, live.line, live.partial = 0, 0, b""
        return True

    def _read(self, live: _Live) -> Iterator[tuple[Path, int, bytes]]:
        if live.done:  # a rotated copy: whole, once
            for number, raw in enumerate(iter_lines(live.path), start=1):
                live.line = number
                if raw and not raw.isspace():
                    yield live.path, number, raw.rstrip(b"\r\n")
            return
        assert live.file is not None
        while True:
            data = live.file.read(CHUNK_BYTES)
            if not data:
                return
            live.offset += len(data)
            data = live.partial + data
            cut = data.rfind(b"\n") + 1
            live.partial = data[cut:]
            for raw in data[:cut].split(b"\n")[:-1]:
                live.line += 1
                if raw and not raw.isspace():
                    yield live.path, live.line, raw
            if len(data) - cut < CHUNK_BYTES:  # (a line longer than a chunk: read on)
                return

    def _check_rotation(self, live: _Live) -> Iterator[tuple[Path, int, bytes]]:
        if live.file is None or live.done:
            return
        try:
            status = os.stat(live.path)
        except FileNotFoundError:
            return  # renamed away, the new one not started yet: the old one is read on
        if (status.st_dev, status.st_ino) == live.identity:
            if status.st_size < live.offset:  # cut back in place (copytruncate)
                live.file.seek(0)
                live.offset, live.line, live.partial = 0, 0, b""
            return
        yield from self._read(live)  # what the old file got before the new one started
        if live.partial.strip():
            self.cut_off.append((live.path, live.line + 1))
        live.file.close()
        live.file = None
        if self._open(live):
            yield from self._read(live)
