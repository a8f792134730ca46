"""One vocabulary: every shared span name and attribute key is spelled once, in ``semconv``.

The tests elsewhere assert the wire format with literals on purpose; this one
guards the package: a module that spells a vocabulary string itself instead
of importing it from :mod:`megatron.trace_format.semconv` could drift from
the others without any test noticing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from megatron.trace_format import semconv

PACKAGE = Path(__file__).resolve().parents[2] / "megatron"
# Report categories are plain words ("startup", "evaluation") that also name
# machine states and legend labels, so only names and keys are checked.
CHECKED = {
    getattr(semconv, name): name
    for name in semconv.__all__
    if isinstance(getattr(semconv, name), str) and not name.startswith("CATEGORY_")
}


def _docstrings(tree: ast.AST) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docstrings = _docstrings(tree)
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r} (semconv.{CHECKED[node.value]})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in CHECKED
        and id(node) not in docstrings
    ]


def test_the_vocabulary_is_defined_once() -> None:
    assert len(CHECKED) > 20  # span names, attribute keys, resource keys
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        # telemetry_spans.py and its Megatron-LM test are copied into Megatron-LM, where
        # this package does not exist: they spell their own names, held equal to these by
        # tests/training/test_telemetry_spans_vocabulary.py
        if relative not in (
            "trace_format/semconv.py",
            "training/telemetry_spans.py",
            "training/port_upstream/test_telemetry_spans.py",
        ):
            found.extend(_literals(path))
    assert found == []


def test_values_are_unique() -> None:
    values = [getattr(semconv, name) for name in semconv.__all__]
    strings = [value for value in values if isinstance(value, str)]
    assert len(strings) == len(set(strings))


def test_structural_spans_are_the_categorised_ones() -> None:
    assert frozenset(semconv.SPAN_CATEGORY) == semconv.STRUCTURAL_SPAN_NAMES
    assert set(semconv.SPAN_CATEGORY.values()) <= {
        semconv.Category.GOODPUT,
        *semconv.BADPUT_CATEGORIES,
    }
