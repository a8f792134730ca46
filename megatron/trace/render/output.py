"""Writing a ``megatron-trace`` output file so that a failure never leaves half of one.

The pictures (the timeline page, the Chrome export) write their file beside
the destination and rename it over at the end: a damaged input line found
half-way, a full disk or a Ctrl-C leaves the previous file (or none), never
a torn one, and no temporary file behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from megatron.trace_format.errors import TraceOutputError

__all__ = ["append_file", "replacing"]


@contextmanager
def replacing(output: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A file to write ``output``'s new content to; renamed over ``output`` on success.

    The file is ``.<name>.tmp`` in ``output``'s directory, so the rename stays
    within one file system; text (UTF-8), or bytes when ``binary``. If the
    block raises, the temporary file is removed and ``output`` is left as it
    was. A directory that does not exist is an error
    (:class:`~megatron.trace_format.errors.TraceOutputError`), never created: a
    mistyped path must not leave folders behind.
    """
    if not output.parent.is_dir():
        raise TraceOutputError(f"cannot write {output}: no folder {output.parent}")
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as out:
            yield out
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_file(out: IO[bytes], part: Path) -> None:
    """Copy the whole of ``part`` (a part an export worker wrote) to the end of ``out``."""
    with open(part, "rb") as source:
        shutil.copyfileobj(source, out, 1 << 20)
