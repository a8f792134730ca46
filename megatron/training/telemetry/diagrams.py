"""Draw the lifecycle machines into ``state_diagrams/`` from their live tables.

The drawings are never typed by hand. This module hands the very ``STATES`` and
``TRANSITIONS`` the runtime machines use to ``transitions``' ``MarkupMachine``,
whose normalised markup (source lists expanded, internal transitions without a
``dest``, conditions as lists) is the one source of every drawing, and writes
for each machine

* ``<name>.dot``: Graphviz DOT source,
* ``<name>.svg``: that source rendered by Graphviz's ``dot``, stamped with the
  SHA-256 of the DOT text it was rendered from,
* ``<name>.mmd``: Mermaid text, which the README embeds between markers so code
  hosts render it inline.

The DOT and Mermaid text is written here rather than taken from
``GraphMachine``, so it depends on the tables alone (not on the ``transitions``
or Graphviz release installed) and follows the rules that keep it legible in
current renderers: every label line names one trigger, conditions read
``[if ...]`` (never confused with the ``[internal]`` marker), no state is
styled as active, and Mermaid line breaks are ``<br/>``.

``python -m megatron.training.telemetry.diagrams`` (``tox -e diagrams``) rewrites the
files and needs ``dot``; ``--check`` only compares, renders the SVGs again, and
exits 1 listing what drifted. The test suite runs the same comparison without
``dot``: text exactly, SVGs by their stamp.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transitions.extensions.markup import MarkupMachine

from megatron.training.telemetry.lifecycle import TrainerExitHooks, TrainerSpanPhases
from megatron.training.telemetry_spans import ExitHooks, SpanPhases

# The --help text. Not taken from __doc__, which ``python -OO`` strips.
_DESCRIPTION = "Draw the lifecycle machines into state_diagrams/ from their live tables."

# Paths are relative to the repository root handed in (the installed package
# does not live inside the checkout, so it cannot find it by itself).
DIAGRAM_DIR = "state_diagrams"
README = "README.md"

INTERNAL = "[internal]"
OTHERWISE = "[else]"
GRAPHVIZ_HINT = (
    "Graphviz's `dot` is not on PATH; install it (Debian/Ubuntu: apt-get install graphviz, "
    "macOS: brew install graphviz, others: https://graphviz.org/download/) and run again"
)
#: The comment :func:`stamp_svg` puts in an SVG; group 1 is the digest it names.
STAMP = re.compile(r"<!-- dot-source-sha256: ([0-9a-f]{64}) -->")
_FONT = "Helvetica,Arial,sans-serif"
# Node names for the initial and final pseudo-states in DOT.
_START, _END = "_initial", "_final"


@dataclass(frozen=True)
class Drawing:
    """One machine to draw: the files' stem, its title, its table (the ``STATES``,
    ``TRANSITIONS`` and initial state its runtime machine is built from), and the
    README (relative to the repository root) that embeds its Mermaid text."""

    name: str
    title: str
    states: tuple[Any, ...]
    transitions: tuple[Mapping[str, Any], ...]
    initial: str
    readme: str = README


DRAWINGS = (
    Drawing("span_phases", "SpanPhases", SpanPhases.STATES, SpanPhases.TRANSITIONS, "job"),
    Drawing("exit_hooks", "ExitHooks", ExitHooks.STATES, ExitHooks.TRANSITIONS, "uninstalled"),
    # This trainer's own hooks (SIGHUP and SIGINT too), on top of the shared module.
    Drawing(
        "trainer_exit_hooks",
        "TrainerExitHooks",
        TrainerExitHooks.STATES,
        TrainerExitHooks.TRANSITIONS,
        "uninstalled",
        "megatron/training/README.md",
    ),
    # This trainer's own lifecycle: the shared one and in-process restarts' cycles.
    Drawing(
        "trainer_span_phases",
        "TrainerSpanPhases",
        TrainerSpanPhases.STATES,
        TrainerSpanPhases.TRANSITIONS,
        "job",
        "megatron/training/README.md",
    ),
)
#: Every README that embeds a drawing.
READMES = tuple(dict.fromkeys(drawing.readme for drawing in DRAWINGS))


class GraphvizMissing(RuntimeError):
    """``dot`` is needed to render the SVGs and is not installed."""


@dataclass(frozen=True)
class _State:
    """A state box: its name over a compartment of one entry per line (UML style):
    ``entry / cb``, ``exit / cb``, then each internal transition it accepts."""

    name: str
    compartment: tuple[str, ...]
    final: bool


@dataclass(frozen=True)
class _Edge:
    """An arrow between two states, one trigger per label line."""

    source: str
    dest: str
    triggers: tuple[str, ...]


@dataclass(frozen=True)
class _Chart:
    title: str
    initial: str
    states: tuple[_State, ...]
    edges: tuple[_Edge, ...]


class _Blank:
    """A model for the markup machine: it must accept the trigger methods."""


def _trigger_line(transition: Mapping[str, Any], otherwise: bool) -> str:
    """``sigterm [if graceful_drain] [internal]``: the trigger, its condition, its kind.

    ``otherwise`` marks an unconditional transition that is tried after a
    conditional one of the same trigger and source: it fires only when that
    condition fails, so it reads ``[else]``.
    """
    unless = (f"not {name}" for name in transition.get("unless", ()))
    guards = [*transition.get("conditions", ()), *unless]
    line = transition["trigger"]
    if guards:
        line += f" [if {' and '.join(guards)}]"
    elif otherwise:
        line += f" {OTHERWISE}"
    if "dest" not in transition:
        line += f" {INTERNAL}"
    return line


def _chart(drawing: Drawing) -> _Chart:
    """The drawing's content, read from the machine ``transitions`` builds of the table."""
    markup = MarkupMachine(
        model=_Blank(),
        states=[dict(s) if isinstance(s, Mapping) else s for s in drawing.states],
        transitions=[dict(t) for t in drawing.transitions],
        initial=drawing.initial,
        auto_transitions=False,
    ).markup
    internal: dict[str, list[str]] = {}
    edges: dict[tuple[str, str], list[str]] = {}
    guarded: set[tuple[str, str]] = set()
    for transition in markup["transitions"]:
        key = (transition["trigger"], transition["source"])
        line = _trigger_line(transition, otherwise=key in guarded)
        if "conditions" in transition or "unless" in transition:
            guarded.add(key)
        if "dest" in transition:
            edges.setdefault((transition["source"], transition["dest"]), []).append(line)
        else:
            internal.setdefault(transition["source"], []).append(line)
    states = []
    for state in markup["states"]:
        name = state["name"]
        if name in (_START, _END):
            raise ValueError(f"state name {name!r} is reserved for the drawing's pseudo-states")
        compartment = [
            *(f"entry / {cb}" for cb in state.get("on_enter", ())),
            *(f"exit / {cb}" for cb in state.get("on_exit", ())),
            *internal.get(name, ()),
        ]
        states.append(_State(name, tuple(compartment), bool(state.get("final"))))
    return _Chart(
        title=drawing.title,
        initial=drawing.initial,
        states=tuple(states),
        edges=tuple(_Edge(src, dst, tuple(lines)) for (src, dst), lines in edges.items()),
    )


def _dot_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _dot_label(title: str, lines: Iterable[str]) -> str:
    """A DOT label: ``title`` centred, then each line left-aligned (``\\l``)."""
    body = "".join(f"{_dot_string(line)}\\l" for line in lines)
    head = _dot_string(title) + ("\\n" if body else "")
    return f'"{head}{body}"'


def _dot(chart: _Chart) -> str:
    out = [
        f'digraph "{_dot_string(chart.title)}" {{',
        f'\tgraph [label="{_dot_string(chart.title)}" labelloc=t rankdir=LR fontname="{_FONT}"]',
        f'\tnode [shape=rectangle style=rounded margin="0.2,0.1" fontname="{_FONT}"]',
        f'\tedge [fontname="{_FONT}"]',
        f'\t{_START} [label="" shape=point width=0.15]',
    ]
    out += [f"\t{s.name} [label={_dot_label(s.name, s.compartment)}]" for s in chart.states]
    if any(s.final for s in chart.states):
        out.append(f'\t{_END} [label="" shape=point width=0.15 peripheries=2]')
    out.append(f"\t{_START} -> {chart.initial}")
    for edge in chart.edges:
        label = "".join(f"{_dot_string(t)}\\l" for t in edge.triggers)
        out.append(f'\t{edge.source} -> {edge.dest} [label="{label}"]')
    out += [f"\t{s.name} -> {_END}" for s in chart.states if s.final]
    return "\n".join([*out, "}"]) + "\n"


def _mermaid(chart: _Chart) -> str:
    out = ["---", f"title: {chart.title}", "---", "stateDiagram-v2", "  direction LR"]
    for state in chart.states:
        out.append(f'  state "{state.name}" as {state.name}')
        out += [f"  {state.name} : {line}" for line in state.compartment]
    out.append(f"  [*] --> {chart.initial}")
    out += [f"  {e.source} --> {e.dest}: {'<br/>'.join(e.triggers)}" for e in chart.edges]
    out += [f"  {s.name} --> [*]" for s in chart.states if s.final]
    return "\n".join(out) + "\n"


def source_digest(dot_source: str) -> str:
    """The SHA-256 an SVG carries of the DOT text it was rendered from."""
    return hashlib.sha256(dot_source.encode("utf-8")).hexdigest()


def stamp_svg(svg: str, dot_source: str) -> str:
    """``svg`` with an XML comment naming the digest of its DOT source, before ``<svg``."""
    at = svg.index("<svg")
    return f"{svg[:at]}<!-- dot-source-sha256: {source_digest(dot_source)} -->\n{svg[at:]}"


def svg_stamp(svg: str) -> str | None:
    """The DOT-source digest stamped into ``svg``, or None when it carries none."""
    found = STAMP.search(svg)
    return found.group(1) if found else None


def _dot_to_svg(dot_source: str) -> str:
    try:
        import graphviz
    except ImportError as exc:
        raise GraphvizMissing(
            "the Python package 'graphviz' is missing: pip install 'megatron-telemetry-spans"
            "[diagrams]' (or run tox -e diagrams)"
        ) from exc
    try:
        return graphviz.Source(dot_source).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound as exc:
        raise GraphvizMissing(GRAPHVIZ_HINT) from exc


def drawing_texts(drawing: Drawing) -> tuple[str, str]:
    """The DOT and the Mermaid text of one drawing, as its files hold them."""
    chart = _chart(drawing)
    return _dot(chart), _mermaid(chart)


def render_text() -> dict[str, str]:
    """The DOT and Mermaid files as the current tables draw them (no ``dot`` needed)."""
    files: dict[str, str] = {}
    for drawing in DRAWINGS:
        files[f"{drawing.name}.dot"], files[f"{drawing.name}.mmd"] = drawing_texts(drawing)
    return files


def render() -> dict[str, str]:
    """Every file under ``state_diagrams/``, SVGs rendered by ``dot`` and stamped."""
    files = render_text()
    for drawing in DRAWINGS:
        dot_source = files[f"{drawing.name}.dot"]
        files[f"{drawing.name}.svg"] = stamp_svg(_dot_to_svg(dot_source), dot_source)
    return files


def _readme_block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN {name}\.mmd[^>]*-->\n```mermaid\n)(.*?)(```\n<!-- END {name}\.mmd -->)",
        re.DOTALL,
    )


def embed_in_readme(readme_text: str, files: Mapping[str, str], readme: str = README) -> str:
    """The README at ``readme`` with each of its Mermaid blocks replaced by the generated text."""
    for drawing in DRAWINGS:
        if drawing.readme != readme:
            continue
        name = f"{drawing.name}.mmd"
        pattern = _readme_block(drawing.name)
        if not pattern.search(readme_text):
            raise RuntimeError(f"{readme} has no block for {name}")
        readme_text = pattern.sub(
            lambda m, text=files[name]: m.group(1) + text + m.group(3), readme_text
        )
    return readme_text


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def drift(root: Path, *, rerender: bool = False) -> list[str]:
    """Names of checked-in files under ``root`` that differ from what the tables draw now.

    DOT, Mermaid and the README blocks are compared exactly. Each SVG must carry
    the digest of the DOT text the tables produce now; with ``rerender`` (needs
    ``dot``) it must also be byte-identical to a fresh rendering.
    """
    directory = root / DIAGRAM_DIR
    files = render() if rerender else render_text()
    stale = [name for name, text in files.items() if _read(directory / name) != text]
    if not rerender:
        for drawing in DRAWINGS:
            svg = _read(directory / f"{drawing.name}.svg")
            wanted = source_digest(files[f"{drawing.name}.dot"])
            if svg is None or svg_stamp(svg) != wanted:
                stale.append(f"{drawing.name}.svg")
    for readme in READMES:
        current_readme = (root / readme).read_text(encoding="utf-8")
        if embed_in_readme(current_readme, files, readme) != current_readme:
            stale.append(readme)
    return sorted(stale)


def write(root: Path) -> list[str]:
    """Regenerate everything under ``root``; return the names that changed.

    Everything is rendered before anything is written, so a missing ``dot``
    leaves the checked-in files as they were.
    """
    directory = root / DIAGRAM_DIR
    files = render()
    readmes = {}
    for readme in READMES:
        current_readme = (root / readme).read_text(encoding="utf-8")
        readmes[readme] = (current_readme, embed_in_readme(current_readme, files, readme))
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in files.items():
        path = directory / name
        if _read(path) != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    for readme, (current_readme, new_readme) in readmes.items():
        if new_readme != current_readme:
            (root / readme).write_text(new_readme, encoding="utf-8")
            changed.append(readme)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megatron.training.telemetry.diagrams", description=_DESCRIPTION
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="render again and compare only; exit 1 listing what drifted",
    )
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="repository root (default: current directory)"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = drift(args.root, rerender=True)
            for name in stale:
                print(f"out of date: {name} (run: tox -e diagrams)", file=sys.stderr)
            return 1 if stale else 0
        for name in write(args.root):
            print(f"wrote {name}")
    except GraphvizMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
