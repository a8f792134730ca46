"""How every message of the writers and the reader counts things: ``1 incarnation``,
``2 incarnations``, never ``1 incarnations``."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the number the count asks for (``plural``
    where adding an ``s`` would be wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
