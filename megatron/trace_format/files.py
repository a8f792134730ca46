"""Opening a trace file as log rotation leaves it: plain, gzip or zstd, told by its first bytes.

A long job's ``traces.jsonl`` gets rotated (``traces.jsonl.1``) and the
rotated copies compressed (``traces.jsonl.2.gz``, or ``.zst`` with zstd), by
logrotate or a collector. The reader takes any of them: the format is told
by the file's magic bytes, not its name (logrotate's ``delaycompress`` and
hand-renamed files keep names that lie), and the stream it returns yields the
same lines a plain file would. Only this module knows about compression; the
decoding of lines (:mod:`megatron.trace.otlp.reader`) never sees it.

gzip is the standard library's; zstd needs the ``zstandard`` package (in
the ``trace`` extra). Without it a zstd file is one clear error, naming the
file and what to install.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from megatron.trace_format.errors import CompressedTraceError

__all__ = [
    "CompressedTraceError",
    "FilePiece",
    "fixed_end",
    "is_compressed",
    "iter_lines",
    "iter_piece_lines",
    "metrics_file_for",
    "numbered",
    "open_trace_file",
    "split_file",
]

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"


def is_compressed(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first 4 bytes) is gzip or zstd."""
    return head.startswith(_GZIP) or head[:4] == _ZSTD


def metrics_file_for(trace_file: Path) -> Path:
    """Where metrics go for a given trace file: ``metrics.jsonl`` beside it.

    A trace file that is itself called ``metrics.jsonl`` gets
    ``metrics.metrics.jsonl`` instead, so spans and metrics never share a file.
    """
    candidate = trace_file.with_name("metrics.jsonl")
    if candidate == trace_file:
        candidate = trace_file.with_name("metrics.metrics.jsonl")
    return candidate


def open_trace_file(path: Path) -> IO[bytes]:
    """``path`` opened for reading lines of bytes, decompressed if it is gzip or zstd."""
    raw = open(path, "rb")  # noqa: SIM115 (returned to the caller, who closes it)
    try:
        magic = raw.peek(4)[:4]
        if magic.startswith(_GZIP):
            raw.close()
            return gzip.open(path, "rb")
        if magic == _ZSTD:
            return _zstd_lines(path, raw)
    except BaseException:
        raw.close()
        raise
    return raw


def iter_lines(path: Path) -> Iterator[bytes]:
    """The lines of ``path``, decompressed; a compressed stream that is cut off or corrupt
    raises :class:`CompressedTraceError` (a rotated file is whole: that is damage)."""
    with open_trace_file(path) as stream:
        try:
            yield from stream
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise CompressedTraceError(
                f"{path}: the gzip data is cut off or damaged ({exc})"
            ) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("zstd"):  # zstandard.ZstdError, without importing it
                raise CompressedTraceError(f"{path}: the zstd data is damaged ({exc})") from exc
            raise


@dataclass(frozen=True)
class FilePiece:
    """A run of whole lines of one trace file: bytes ``start`` to ``stop`` (``None``: the
    end), whose first line is line ``first_line`` of the file (0: not counted yet, see
    :func:`numbered`; a reader must be given the piece numbered).

    Reading is CPU-bound, so one big file is read faster as pieces in parallel
    processes (:func:`split_file`); the whole file is ``FilePiece(path)``. Only
    a plain file can be cut (a compressed stream cannot be entered midway).
    """

    path: Path
    start: int = 0
    stop: int | None = None
    first_line: int = 1


def fixed_end(piece: FilePiece) -> FilePiece:
    """``piece`` ending where its file ends now, not where it will: so that two passes over
    a file a running job still appends to read the same lines. (A compressed file is
    never appended to: it stays as it is.)"""
    if piece.stop is not None:
        return piece
    with open(piece.path, "rb") as stream:
        if is_compressed(stream.read(4)):
            return piece
        size = stream.seek(0, 2)
    return FilePiece(piece.path, piece.start, size, piece.first_line)


def iter_piece_lines(piece: FilePiece) -> Iterator[bytes]:
    """The lines of ``piece`` (all of its file's, decompressed, when it is the whole file)."""
    if piece.start == 0 and piece.stop is None:
        yield from iter_lines(piece.path)
        return
    with open(piece.path, "rb") as stream:
        stream.seek(piece.start)
        position, stop = piece.start, piece.stop
        for raw in stream:
            yield raw
            position += len(raw)
            if stop is not None and position >= stop:
                return


#: Bytes per block when counting the lines before a cut (:func:`numbered`).
_COUNT_BLOCK = 1 << 22


def split_file(path: Path, pieces: int, count_lines: bool = True) -> list[FilePiece]:
    """``path`` cut at line ends into about ``pieces`` runs of equal size, in order.

    A compressed file, or a ``pieces`` under 2, is one piece. The line number of
    each cut is counted by :func:`numbered` (a memory scan of the bytes before
    it, a small fraction of decoding them), so every piece reports the line
    numbers the whole file would; with ``count_lines=False`` the pieces but the
    first say ``first_line=0``, for :func:`numbered` to count later.
    """
    if pieces < 2:
        return [FilePiece(path)]
    with open(path, "rb") as stream:
        if is_compressed(stream.read(4)):
            return [FilePiece(path)]
        size = stream.seek(0, 2)
        cuts = []
        for k in range(1, pieces):
            stream.seek(max(size * k // pieces - 1, 0))
            stream.readline()  # to the start of the next whole line
            cut = stream.tell()
            if cut < size and (not cuts or cut > cuts[-1]):
                cuts.append(cut)
        if not cuts:
            return [FilePiece(path)]
    starts, stops = [0, *cuts], [*cuts, None]
    uncounted = [
        FilePiece(path, start, stop, 1 if start == 0 else 0)
        for start, stop in zip(starts, stops, strict=True)
    ]
    return list(numbered(uncounted)) if count_lines else uncounted


def _newlines(stream: IO[bytes], start: int, stop: int) -> int:
    """How many newlines bytes ``start`` to ``stop`` of ``stream`` hold (read in big blocks)."""
    stream.seek(start)
    newlines, position = 0, start
    while position < stop:
        block = stream.read(min(_COUNT_BLOCK, stop - position))
        if not block:
            break
        newlines += block.count(b"\n")
        position += len(block)
    return newlines


def numbered(pieces: Iterable[FilePiece]) -> Iterator[FilePiece]:
    """The pieces in order, each with its ``first_line``: a piece that says 0 is numbered
    from the one before it (of the same file, ending where it starts), whose newlines
    are counted just then.

    Consumed as pieces are handed to workers, the counting of a big file's lines
    runs while the pieces before are already being read, instead of before any.
    """
    previous: FilePiece | None = None
    for piece in pieces:
        if piece.first_line == 0:
            with open(piece.path, "rb") as stream:
                if (
                    previous is not None
                    and previous.path == piece.path
                    and previous.stop == piece.start
                ):
                    first = previous.first_line + _newlines(stream, previous.start, piece.start)
                else:
                    first = 1 + _newlines(stream, 0, piece.start)
            piece = FilePiece(piece.path, piece.start, piece.stop, first)
        previous = piece
        yield piece


def _zstd_lines(path: Path, raw: io.BufferedReader) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raw.close()
        raise CompressedTraceError(
            f"{path}: a zstd-compressed trace; reading it needs the zstandard package: "
            "pip install zstandard (or 'megatron-telemetry-spans[trace]')"
        ) from None
    return io.BufferedReader(_ZstdFrames(path, raw, zstandard.ZstdDecompressor()))


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every frame in turn (``zstd -c >>`` appends frames).

    zstandard's own stream reader ends quietly where a cut-off file ends;
    this says so, since a rotated file is whole and a cut one is damage.
    """

    def __init__(self, path: Path, raw: io.BufferedReader, context: object) -> None:
        self._path, self._raw, self._context = path, raw, context
        self._frame = context.decompressobj()  # type: ignore[attr-defined]
        self._in_frame = False
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._in_frame:
                    raise CompressedTraceError(f"{self._path}: the zstd data is cut off")
                return 0
            while chunk:
                self._in_frame = True
                self._pending += self._frame.decompress(chunk)
                if not self._frame.eof:
                    break
                chunk = self._frame.unused_data
                self._frame = self._context.decompressobj()  # type: ignore[attr-defined]
                self._in_frame = False
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()
