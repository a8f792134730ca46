"""Columns of JSON values written as they are made, kept on disk, read back as arrays.

The timeline draws a bar per checkpoint interval, save and evaluation: a week of
a job that checkpoints often is hundreds of thousands of bars. Held as plotly
figure data, each bar cost a few kilobytes (its hover text, its timestamps as
strings, the figure's validated copies of both), so the page's memory grew with
the file. A :class:`JsonColumns` takes the values instead, column by column (a
trace's ``y``, ``base``, hover text, ...), encodes them a chunk at a time,
escaped for a ``<script>`` as plotly escapes its JSON, and writes each chunk to
the read's temporary file (:mod:`megatron.trace._store.spill`); :meth:`JsonColumns.array`
reads a column back as a JSON array, a chunk at a time, for the page to write.
Memory stays a chunk per column, whatever the number of bars.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from megatron.trace._store import spill

__all__ = ["CHUNK_VALUES", "JsonColumns", "script_safe"]

#: Values a column gathers before it encodes and writes them (a chunk of hover
#: texts is a few hundred kilobytes).
CHUNK_VALUES = 1024

# What plotly escapes in the JSON it puts inside <script> (so a value holding
# "</script>" cannot end the script), escaped the same way; and the two line separators
# older JavaScript does not allow in a string (plotly's orjson path escapes them too).
_UNSAFE_IN_SCRIPT = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"/", b"\\u002f"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def script_safe(data: bytes) -> bytes:
    """UTF-8 JSON made safe to put inside a ``<script>``, as plotly makes its own."""
    for unsafe, escaped in _UNSAFE_IN_SCRIPT:
        if unsafe in data:
            data = data.replace(unsafe, escaped)
    return data


def _encoder() -> Callable[[list[Any]], bytes]:
    """msgspec's JSON encoder, else the standard library's (the same JSON values)."""
    try:
        import msgspec
    except ImportError:
        return lambda values: json.dumps(
            values, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    return msgspec.json.Encoder().encode


# A chunk: its bytes in memory (no temporary file could be written), or where it lies.
_Chunk = bytes | tuple[spill.Store, int, int]


class JsonColumns:
    """Named columns of JSON values (strings, ints, floats), each an array in the end."""

    def __init__(self, chunk_values: int | None = None) -> None:
        self._chunk_values = chunk_values or CHUNK_VALUES
        self._encode = _encoder()
        self._pending: dict[str, list[Any]] = {}
        self._chunks: dict[str, list[_Chunk]] = {}
        self._counts: dict[str, int] = {}

    def append(self, column: str, value: Any) -> None:
        """Add ``value`` to the end of ``column`` (a new column starts empty)."""
        pending = self._pending.get(column)
        if pending is None:
            pending = self._pending[column] = []
        pending.append(value)
        if len(pending) >= self._chunk_values:
            self._write(column)

    def count(self, column: str) -> int:
        """How many values ``column`` holds (0 for a column never appended to)."""
        return self._counts.get(column, 0) + len(self._pending.get(column, ()))

    def array(self, column: str) -> Iterator[bytes]:
        """The column as one JSON array, script-safe, in pieces (read back a chunk at a
        time; the column can be read again)."""
        self._write(column)
        yield b"["
        for position, chunk in enumerate(self._chunks.get(column, ())):
            if position:
                yield b","
            yield chunk if isinstance(chunk, bytes) else chunk[0].read(chunk[1], chunk[2])
        yield b"]"

    def _write(self, column: str) -> None:
        values = self._pending.pop(column, None)
        if not values:
            return
        data = script_safe(self._encode(values))[1:-1]  # the elements, without [ ]
        where = spill.write([data])
        self._chunks.setdefault(column, []).append(
            data if where is None else (where[0], where[1], len(data))
        )
        self._counts[column] = self._counts.get(column, 0) + len(values)
