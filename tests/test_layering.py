"""Each room imports only the rooms below it (``megatron/trace/README.md``, "Rooms").

The base layer must stay liftable into another trainer, and ``megatron-trace``
must read a trace where the trainer is not installed (or where Megatron-LM's
own ``megatron.core`` and ``megatron.training`` are), so an import of a higher
room fails here, wherever it is written (module top or inside a function).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE = REPO_ROOT / "megatron"

# The rooms, lowest first: each may import only the rooms listed for it (besides
# itself). ``megatron.trace_format`` is the bottom of everything: the vocabulary,
# the error type and the trace files, shared by the writers and the reader.
_FORMAT = frozenset({"megatron.trace_format"})
_OTLP = _FORMAT | {"megatron.trace.otlp"}
_STORE = _OTLP | {"megatron.trace._store"}
_MODEL = _STORE | {"megatron.trace.model"}
_ANALYSIS = _MODEL | {"megatron.trace.analysis"}
_LIVE = _ANALYSIS | {"megatron.trace.live"}
_RENDER = _LIVE | {"megatron.trace.render"}
ROOMS: dict[str, frozenset[str]] = {
    "megatron.trace_format": frozenset(),
    "megatron.trace.otlp": _FORMAT,
    "megatron.trace._store": _OTLP,
    "megatron.trace.model": _STORE,
    "megatron.trace.analysis": _MODEL,
    "megatron.trace.live": _ANALYSIS,
    "megatron.trace.render": _LIVE,
    "megatron.trace.cli": _RENDER,
}
ALLOWED: dict[str, frozenset[str]] = {
    **ROOMS,
    # the front modules (__init__, __main__): the public API over every room
    "megatron.trace": frozenset(ROOMS),
    # the writers: the vocabulary, the error type and the file format, nothing that reads
    "megatron.core": _FORMAT,
    "megatron.training": frozenset({"megatron.core", *ROOMS}),
}


def _layer(module: str) -> str | None:
    """The room ``module`` is in: the longest name in ``ALLOWED`` it starts with."""
    parts = module.split(".")
    if parts[0] != "megatron" or len(parts) < 2:
        return None
    for size in (3, 2):
        if ".".join(parts[:size]) in ALLOWED:
            return ".".join(parts[:size])
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
                module = ".".join([*base, *filter(None, [node.module])])
            else:
                module = node.module or ""
            # ``from megatron.trace import semconv`` imports the module semconv
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        own = _layer(".".join(path.relative_to(root.parent).with_suffix("").parts))
        if own not in ALLOWED:
            continue
        for lineno, module in _imports(path, root):
            target = _layer(module)
            if target is None or target == own or target in ("megatron.trace",):
                continue
            if target not in ALLOWED[own]:
                found.append(f"{path.relative_to(root.parent)}:{lineno}: {own} imports {module}")
    return found


def test_every_room_imports_only_the_rooms_below_it() -> None:
    assert _violations(SOURCE) == []


def test_the_rooms_cover_every_package() -> None:
    packages = {
        ".".join(p.parent.relative_to(SOURCE.parent).parts) for p in SOURCE.rglob("__init__.py")
    }
    assert {_layer(name) for name in packages} <= set(ALLOWED)
    in_trace = {name for name in packages if name.startswith("megatron.trace.")}
    assert {_layer(name) for name in in_trace} == {
        name for name in ROOMS if name.startswith("megatron.trace.")
    }


def test_megatron_is_a_namespace_as_in_megatron_lm() -> None:
    # Megatron-LM's tree has no megatron/__init__.py, and megatron-core's wheel ships
    # megatron/core/__init__.py: a file of ours at either place shadows or breaks theirs.
    assert not (SOURCE / "__init__.py").exists()
    assert not (SOURCE / "core" / "__init__.py").exists()


def test_the_trace_package_front_holds_only_its_front_modules() -> None:
    front = {path.name for path in (SOURCE / "trace").glob("*.py")}
    assert front == {"__init__.py", "__main__.py"}


@pytest.mark.parametrize(
    ("file", "source", "expected"),
    [
        ("core/telemetry/x.py", "from megatron.training import arguments\n", "megatron.training"),
        ("core/telemetry/x.py", "def f():\n    import megatron.trace.cli.report\n", "megatron.trace.cli"),  # noqa: E501
        ("core/telemetry/x.py", "from megatron.trace.analysis import check\n", "megatron.trace.analysis"),  # noqa: E501
        ("trace/otlp/x.py", "from ...training import telemetry_spans\n", "megatron.training"),
        ("trace/otlp/x.py", "from megatron.core.telemetry import jsonl\n", "megatron.core"),
        ("trace/otlp/x.py", "from megatron.trace.model import trace\n", "megatron.trace.model"),
        ("trace_format/x.py", "from megatron.trace.otlp import reader\n", "megatron.trace.otlp"),
        ("trace/model/x.py", "from megatron.trace.live import job\n", "megatron.trace.live"),
        ("trace/analysis/x.py", "from ..live import follow\n", "megatron.trace.live"),
        ("trace/model/x.py", "from ..analysis import goodput\n", "megatron.trace.analysis"),
        ("trace/render/x.py", "from megatron.trace import cli\n", "megatron.trace.cli"),
    ],
)  # fmt: skip
def test_an_import_of_a_higher_room_is_found(
    tmp_path: Path, file: str, source: str, expected: str
) -> None:
    root = tmp_path / "megatron"
    path = root / file
    path.parent.mkdir(parents=True)
    path.write_text(source)
    (violation,) = _violations(root)
    assert f"imports {expected}" in violation


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere (for types, in functions too)."""
    names = {
        ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for path in root.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        found = set()
        for _, name in _imports(path, root):
            while name and name not in names:  # ``from pkg import name``: pkg's module
                name = name.rpartition(".")[0]
            if name and name != module and name not in ("megatron", "megatron.trace"):
                found.add(name)
        graph[module] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], {start}
        while stack:
            node, path = stack.pop()
            for target in sorted(graph.get(node, ())):
                if target == start:
                    found.append(path)
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    # not even for types only: a cycle means the two are one concept, or a layer is wrong
    assert _cycles(_module_graph(SOURCE)) == []


def test_a_type_only_cycle_is_found(tmp_path: Path) -> None:
    root = tmp_path / "megatron"
    (root / "trace" / "model").mkdir(parents=True)
    (root / "trace" / "model" / "a.py").write_text("from megatron.trace.model import b\n")
    (root / "trace" / "model" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n"
    )
    assert _cycles(_module_graph(root)) == [
        ["megatron.trace.model.a", "megatron.trace.model.b"],
        ["megatron.trace.model.b", "megatron.trace.model.a"],
    ]
