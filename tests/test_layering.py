"""Each package imports only the layers below it (README, "Layout").

The base layer must stay liftable into another trainer, and ``megatron-trace``
must read a trace where the trainer is not installed, so an import of a higher
layer fails here, wherever it is written (module top or inside a function).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE = REPO_ROOT / "megatron"

# Package -> the packages of ours it may import besides itself.
ALLOWED: dict[str, frozenset[str]] = {
    "megatron.core": frozenset(),
    "megatron.trace": frozenset({"megatron.core"}),
    "megatron.training": frozenset({"megatron.core", "megatron.trace"}),
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "megatron" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """Every absolute module name ``path`` imports, relative imports resolved."""
    # The package a relative import starts from (a module's, or __init__'s own).
    package = list(path.relative_to(root.parent).parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                found.append((node.lineno, ".".join([*base, *filter(None, [node.module])])))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def _violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        own = _layer(".".join(path.relative_to(root.parent).with_suffix("").parts))
        if own not in ALLOWED:
            continue
        for lineno, module in _imports(path, root):
            target = _layer(module)
            if target is None or target == own or module == "megatron":
                continue
            if target not in ALLOWED[own]:
                found.append(f"{path.relative_to(root.parent)}:{lineno}: {own} imports {module}")
    return found


def test_every_package_imports_only_the_layers_below_it() -> None:
    assert _violations(SOURCE) == []


def test_the_layers_cover_every_package() -> None:
    packages = {p.name for p in SOURCE.iterdir() if (p / "__init__.py").is_file()}
    assert {f"megatron.{name}" for name in packages} == set(ALLOWED)


@pytest.mark.parametrize(
    ("file", "source", "expected"),
    [
        ("core/telemetry/x.py", "from megatron.training import arguments\n", "megatron.training"),
        ("core/telemetry/x.py", "def f():\n    import megatron.trace.report\n", "megatron.trace"),
        ("trace/x.py", "from ..training import telemetry_spans\n", "megatron.training"),
    ],
)
def test_an_import_of_a_higher_layer_is_found(
    tmp_path: Path, file: str, source: str, expected: str
) -> None:
    root = tmp_path / "megatron"
    path = root / file
    path.parent.mkdir(parents=True)
    path.write_text(source)
    (violation,) = _violations(root)
    assert f"imports {expected}" in violation
