"""Draw the lifecycle machines into ``state_diagrams/`` from their live tables.

The drawings are never typed by hand: this module builds a
``transitions.extensions.GraphMachine`` from the very ``STATES`` and
``TRANSITIONS`` data the runtime machines use, and writes for each machine

* ``<name>.dot``: Graphviz DOT source,
* ``<name>.svg``: that source rendered by Graphviz's ``dot``,
* ``<name>.mmd``: Mermaid text, which the README embeds between markers so code
  hosts render it inline.

``python -m megatron.training.diagrams`` (``tox -e diagrams``) rewrites them;
``--check`` only compares and exits 1 listing what drifted. The test suite runs
the same comparison, so CI fails when the table changes and the drawings don't.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transitions.extensions import GraphMachine

from megatron.training.telemetry_spans import ExitHooks, SpanPhases

# Paths are relative to the repository root handed in (the installed package
# does not live inside the checkout, so it cannot find it by itself).
DIAGRAM_DIR = "state_diagrams"
README = "README.md"


@dataclass(frozen=True)
class _Drawing:
    name: str
    title: str
    states: tuple[Any, ...]
    transitions: tuple[Mapping[str, Any], ...]
    initial: str


DRAWINGS = (
    _Drawing("span_phases", "SpanPhases", SpanPhases.STATES, SpanPhases.TRANSITIONS, "job"),
    _Drawing("exit_hooks", "ExitHooks", ExitHooks.STATES, ExitHooks.TRANSITIONS, "uninstalled"),
)


class _Blank:
    """A model for the drawing machine: it must accept the trigger methods."""


def _graph(drawing: _Drawing, engine: str) -> Any:
    model = _Blank()
    GraphMachine(
        model=model,
        states=[dict(s) if isinstance(s, Mapping) else s for s in drawing.states],
        transitions=[dict(t) for t in drawing.transitions],
        initial=drawing.initial,
        auto_transitions=False,
        graph_engine=engine,
        show_conditions=True,
        show_state_attributes=True,
        title=drawing.title,
    )
    return model.get_graph()


def _mermaid(drawing: _Drawing) -> str:
    text = _graph(drawing, "mermaid").draw(None)
    # Two fixes to what transitions writes, so code hosts render it: the front
    # matter must be YAML ("title: X", not a bare "X"), and Mermaid's class
    # statement is lowercase ("class", not "Class").
    text = re.sub(r"\A---\n(?!title:)(.+)\n---", r"---\ntitle: \1\n---", text)
    text = re.sub(r"^(\s*)Class ", r"\1class ", text, flags=re.MULTILINE)
    return text.rstrip() + "\n"


def _dot_to_svg(dot_source: str) -> str:
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            "Graphviz's 'dot' is not on PATH; install the Debian package 'graphviz' "
            "(apt-get install graphviz) to render state_diagrams/*.svg"
        )
    done = subprocess.run(
        [dot, "-Tsvg"], input=dot_source, capture_output=True, text=True, check=True
    )
    return done.stdout


def render() -> dict[str, str]:
    """Every file under ``state_diagrams/`` as the current tables draw it."""
    files: dict[str, str] = {}
    for drawing in DRAWINGS:
        dot_source = _graph(drawing, "graphviz").source
        files[f"{drawing.name}.dot"] = dot_source
        files[f"{drawing.name}.svg"] = _dot_to_svg(dot_source)
        files[f"{drawing.name}.mmd"] = _mermaid(drawing)
    return files


def _readme_block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN {name}\.mmd[^>]*-->\n```mermaid\n)(.*?)(```\n<!-- END {name}\.mmd -->)",
        re.DOTALL,
    )


def embed_in_readme(readme_text: str, files: Mapping[str, str]) -> str:
    """The README with each Mermaid block replaced by the generated text."""
    for drawing in DRAWINGS:
        name = f"{drawing.name}.mmd"
        pattern = _readme_block(drawing.name)
        if not pattern.search(readme_text):
            raise RuntimeError(f"README.md has no block for {name}")
        readme_text = pattern.sub(
            lambda m, text=files[name]: m.group(1) + text + m.group(3), readme_text
        )
    return readme_text


def drift(root: Path) -> list[str]:
    """Names of checked-in files under ``root`` that differ from what the tables draw now."""
    directory, readme = root / DIAGRAM_DIR, root / README
    files = render()
    stale = [
        name
        for name, text in files.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    current_readme = readme.read_text()
    if embed_in_readme(current_readme, files) != current_readme:
        stale.append(readme.name)
    return stale


def write(root: Path) -> list[str]:
    """Regenerate everything under ``root``; return the names that changed."""
    directory, readme = root / DIAGRAM_DIR, root / README
    files = render()
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in files.items():
        path = directory / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(name)
    current_readme = readme.read_text()
    new_readme = embed_in_readme(current_readme, files)
    if new_readme != current_readme:
        readme.write_text(new_readme)
        changed.append(readme.name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megatron.training.diagrams", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="compare only; exit 1 if anything drifted"
    )
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="repository root (default: current directory)"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = drift(args.root)
        for name in stale:
            print(f"out of date: {name} (run: tox -e diagrams)", file=sys.stderr)
        return 1 if stale else 0
    for name in write(args.root):
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
