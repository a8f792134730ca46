"""What the parallel-read tests hand to worker processes.

A worker started with ``spawn`` (the pool's choice when the test process runs
threads) imports the function it is given by module name: a test module is
not importable there, a module of ``tests/support`` is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["meet", "name_of", "reader_of"]


def reader_of(path: Path) -> tuple[str, int]:
    """The file's name and the process that was handed it."""
    return path.name, os.getpid()


def name_of(path: Path) -> list[str]:
    """The file's name, in a list: lists merged by ``+`` show the order they merged in."""
    return [path.name]


def meet(path: Path, others: int = 1, patience_s: float = 60.0) -> bool:
    """Say this file's read began, then wait for ``others`` more files of its directory to
    say the same: True once they have (their reads overlapped this one), False when
    ``patience_s`` passed first (this read ran alone)."""
    path.with_name(f"{path.name}.began").touch()
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if len(list(path.parent.glob("*.began"))) > others:
            return True
        time.sleep(0.01)
    return False
