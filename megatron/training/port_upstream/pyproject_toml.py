"""The port's edit of Megatron-LM's ``pyproject.toml``: ``transitions`` where
Megatron-LM's telemetry users get their telemetry packages.

``telemetry_spans.py`` needs ``transitions`` only where telemetry is on, as it
needs OpenTelemetry, so it joins the ``otel`` extra (beside ``nemo-lens[sdk]``)
and ``dev``, whose packages Megatron-LM's CI installs for its tests;
megatron-core's own dependencies stay as they are. Only those two arrays change:
the edit is made as text, and checked by parsing the result.
"""

from __future__ import annotations

import re
from pathlib import Path

from .training_py import NotRecognised

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

PYPROJECT = Path("pyproject.toml")
DEPENDENCY = "transitions>=0.9.2,<0.10"
#: The extras of Megatron-LM's pyproject.toml that get DEPENDENCY: ``otel`` (the
#: telemetry packages, nemo-lens with its SDK) and ``dev`` (what its CI tests with).
EXTRAS = ("otel", "dev")
#: The extras the port cannot do without.
REQUIRED_EXTRAS = ("otel",)


def _list_end(text: str, opening: int) -> int:
    """The index of the ``]`` closing the TOML array whose ``[`` is at ``opening``."""
    depth, quote, index = 0, "", opening
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "#":
            newline = text.find("\n", index)
            index = len(text) if newline < 0 else newline
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise NotRecognised(f"{PYPROJECT}: an array opened at offset {opening} is never closed")


def _extras_table(text: str) -> tuple[int, int]:
    """Where ``[project.optional-dependencies]``'s body begins and ends in ``text``."""
    header = re.search(r"^\[project\.optional-dependencies\]\s*$", text, re.M)
    if header is None:
        raise NotRecognised(f"{PYPROJECT}: could not find `[project.optional-dependencies]`")
    following = re.search(r"^\[", text[header.end() :], re.M)
    return header.end(), len(text) if following is None else header.end() + following.start()


def add_dependency(text: str) -> str:
    """``pyproject.toml`` with ``transitions`` in the ``otel`` and ``dev`` extras.

    An extra that already names ``transitions`` is left as it is; ``dev`` may be
    missing, ``otel`` may not. Nothing else in the file changes.
    """
    original = text
    for extra in EXTRAS:
        begin, end = _extras_table(text)
        match = re.compile(rf"^{extra}\s*=\s*\[", re.M).search(text, begin, end)
        if match is None:
            if extra in REQUIRED_EXTRAS:
                raise NotRecognised(
                    f"{PYPROJECT}: could not find `{extra} = [...]` in "
                    "[project.optional-dependencies]"
                )
            continue
        opening = match.end() - 1
        closing = _list_end(text, opening)
        body = text[opening + 1 : closing]
        if re.search(r"""["']transitions\b""", body):
            continue
        if "\n" in body:
            stripped = body.rstrip()
            comma = "" if stripped.endswith((",", "[")) or not stripped.strip() else ","
            new_body = f'{stripped}{comma}\n    "{DEPENDENCY}",\n'
        elif body.strip():
            new_body = f'{body.rstrip().rstrip(",")}, "{DEPENDENCY}"'
        else:
            new_body = f'"{DEPENDENCY}"'
        text = text[: opening + 1] + new_body + text[closing:]
    _check_only_extras_grew(original, text)
    return text


def _check_only_extras_grew(before: str, after: str) -> None:
    """Raise NotRecognised unless ``after`` parses as ``before`` plus DEPENDENCY in
    the extras (a layout the text edit did not foresee, such as a trailing comment)."""
    if tomllib is None or before == after:  # Python 3.10: no TOML reader to check with
        return
    try:
        old, new = tomllib.loads(before), tomllib.loads(after)
    except tomllib.TOMLDecodeError as err:
        raise NotRecognised(
            f"{PYPROJECT}: does not parse after adding {DEPENDENCY} ({err})"
        ) from None
    extras = old.get("project", {}).get("optional-dependencies", {})
    for extra in EXTRAS:
        if extra in extras and not any(d.startswith("transitions") for d in extras[extra]):
            extras[extra] = [*extras[extra], DEPENDENCY]
    if new != old:
        raise NotRecognised(f"{PYPROJECT}: adding {DEPENDENCY} changed more than the extras")
