"""The checked-in drawings are what the live transition tables draw now, and legible.

None of this needs Graphviz: DOT and Mermaid text are compared exactly, each SVG
by the digest of its DOT source stamped into it. Rendering again with a real
``dot`` is CI's job (``tox -e diagrams -- --check``).
"""

import re
import shutil
from pathlib import Path

import pytest

from megatron.training.telemetry import diagrams
from megatron.training.telemetry_spans import ExitHooks, SpanPhases

REPO_ROOT = Path(__file__).resolve().parents[3]
TABLES = {"span_phases": SpanPhases, "exit_hooks": ExitHooks}

# A machine exercising what the live tables do not (yet): two triggers between
# the same states, a reflexive self-loop, an ``unless`` condition.
EXTRA = diagrams.Drawing(
    "extra",
    "Extra",
    ({"name": "idle", "on_enter": "_arm"}, "busy"),
    (
        {"trigger": "go", "source": "idle", "dest": "busy", "conditions": "ready"},
        {"trigger": "go", "source": "idle", "dest": "busy"},
        {"trigger": "kick", "source": "idle", "dest": "busy", "unless": ["paused", "done"]},
        {"trigger": "poke", "source": "busy", "dest": "busy"},
        {"trigger": "nudge", "source": "busy", "dest": "busy"},
        {"trigger": "tick", "source": "busy", "dest": None, "conditions": ["a", "b"]},
        {"trigger": "stop", "source": "busy", "dest": "idle"},
    ),
    "idle",
)


def _all_texts():
    """(DOT, Mermaid) for the live machines and the extra one."""
    return [diagrams.drawing_texts(d) for d in (*diagrams.DRAWINGS, EXTRA)]


def _dot_label_lines(dot: str) -> list[str]:
    lines = []
    for label in re.findall(r'label="((?:[^"\\]|\\.)*)"', dot):
        lines += [line for line in re.split(r"\\[nl]", label) if line]
    return lines


def _mermaid_label_lines(mermaid: str) -> list[str]:
    lines = []
    for row in mermaid.splitlines():
        found = re.match(r"\s*\S+ (?:-->\s*\S+:|:) (.*)$", row)
        if found and not row.strip().startswith("title:"):
            lines += found.group(1).split("<br/>")
    return lines


def _label_lines(dot: str, mermaid: str) -> list[str]:
    return _dot_label_lines(dot) + _mermaid_label_lines(mermaid)


def _copy_checkout(tmp_path: Path) -> Path:
    shutil.copytree(REPO_ROOT / "state_diagrams", tmp_path / "state_diagrams")
    for readme in diagrams.READMES:
        (tmp_path / readme).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / readme, tmp_path / readme)
    return tmp_path


def test_state_diagrams_match_the_transition_tables_without_graphviz(tmp_path, monkeypatch):
    # A fresh machine has no `dot`: the default test run must not need one.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    stale = diagrams.drift(REPO_ROOT)
    assert stale == [], f"regenerate with `tox -e diagrams` (needs Graphviz): {stale}"


def test_each_svg_carries_the_digest_of_its_dot_source():
    for drawing in diagrams.DRAWINGS:
        svg = (REPO_ROOT / "state_diagrams" / f"{drawing.name}.svg").read_text()
        dot = (REPO_ROOT / "state_diagrams" / f"{drawing.name}.dot").read_text()
        assert f"<title>{drawing.title}</title>" in svg
        assert diagrams.svg_stamp(svg) == diagrams.source_digest(dot)


def test_a_table_change_without_regenerating_is_drift(tmp_path, monkeypatch):
    root = _copy_checkout(tmp_path)
    assert diagrams.drift(root) == []

    extra = {"trigger": "resume", "source": "shutdown", "dest": "job"}
    changed = diagrams.Drawing(
        "span_phases", "SpanPhases", SpanPhases.STATES, (*SpanPhases.TRANSITIONS, extra), "job"
    )
    monkeypatch.setattr(diagrams, "DRAWINGS", (changed, diagrams.DRAWINGS[1]))
    # The SVG is stale too: its stamp names the old DOT source.
    assert diagrams.drift(root) == [
        "README.md",
        "span_phases.dot",
        "span_phases.mmd",
        "span_phases.svg",
    ]


def test_an_svg_rendered_from_other_source_is_drift(tmp_path):
    root = _copy_checkout(tmp_path)
    svg_path = root / "state_diagrams" / "exit_hooks.svg"
    svg = svg_path.read_text()
    svg_path.write_text(diagrams.stamp_svg(re.sub(diagrams.STAMP, "", svg), "digraph {}"))
    assert diagrams.drift(root) == ["exit_hooks.svg"]
    svg_path.write_text(re.sub(diagrams.STAMP, "", svg))
    assert diagrams.drift(root) == ["exit_hooks.svg"]
    svg_path.unlink()
    assert diagrams.drift(root) == ["exit_hooks.svg"]


def test_an_edited_drawing_is_drift(tmp_path):
    root = _copy_checkout(tmp_path)
    mmd = root / "state_diagrams" / "span_phases.mmd"
    mmd.write_text(mmd.read_text().replace("start_job", "begin"))
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("sigterm [else]", "sigterm"))
    assert diagrams.drift(root) == ["README.md", "span_phases.mmd"]


def test_every_trigger_appears_in_its_drawing():
    files = diagrams.render_text()
    for name, table in TABLES.items():
        for transition in table.TRANSITIONS:
            assert transition["trigger"] in files[f"{name}.dot"]
            assert transition["trigger"] in files[f"{name}.mmd"]


def test_mermaid_breaks_lines_with_br_never_a_literal_backslash_n():
    for _, mermaid in _all_texts():
        assert "\\n" not in mermaid
    _, mermaid = diagrams.drawing_texts(EXTRA)
    assert "  busy --> busy: poke<br/>nudge\n" in mermaid


def test_no_state_is_styled_as_active():
    # A drawing documents the machine; it is not a snapshot of one instance.
    for drawing in (*diagrams.DRAWINGS, EXTRA):
        dot, mermaid = diagrams.drawing_texts(drawing)
        # Every state's node statement carries its label and nothing else.
        for state in drawing.states:
            name = state["name"] if isinstance(state, dict) else state
            (row,) = [r for r in dot.splitlines() if r.startswith(f"\t{name} [")]
            assert re.fullmatch(rf'\t{name} \[label="(?:[^"\\]|\\.)*"\]', row), row
        assert "color" not in dot
        for row in mermaid.splitlines():
            assert not re.match(r"\s*(classDef|class|style)\s", row), row
            assert ":::" not in row
            assert "fill:" not in row


def test_every_label_line_names_one_trigger():
    drawings = [(diagrams.drawing_texts(d), d) for d in (*diagrams.DRAWINGS, EXTRA)]
    for (dot, mermaid), drawing in drawings:
        triggers = {t["trigger"] for t in drawing.transitions}
        states = {s["name"] if isinstance(s, dict) else s for s in drawing.states}
        lines = _label_lines(dot, mermaid)
        assert lines
        for line in lines:
            assert "|" not in line, line
            if line in states or line == drawing.title or re.match(r"(entry|exit) / ", line):
                continue
            named = [w for w in re.findall(r"\w+", line.split(" [")[0]) if w in triggers]
            assert len(named) == 1 and line.split(" ")[0] in triggers, line


def test_conditions_are_written_apart_from_the_internal_marker():
    for dot, mermaid in _all_texts():
        for line in _label_lines(dot, mermaid):
            for bracket in re.findall(r"\[[^\]]*\]", line):
                assert bracket in ("[internal]", "[else]") or bracket.startswith("[if "), line
    dot, mermaid = diagrams.drawing_texts(diagrams.DRAWINGS[1])
    for text in (dot, mermaid):
        assert "sigterm [if graceful]" in text
        assert "sigterm [else]" in text
    dot, mermaid = diagrams.drawing_texts(diagrams.DRAWINGS[2])
    for text in (dot, mermaid):
        assert "sigterm [if graceful_drain] [internal]" in text
        assert "sigterm [else]" in text
    # The trainer's lifecycle: a cycle's way out of pretrain() and NVRx's finalize.
    dot, mermaid = diagrams.drawing_texts(diagrams.DRAWINGS[3])
    for text in (dot, mermaid):
        for line in ("shutdown [if restart_follows]", "restart [else]", "restart [internal]"):
            assert line in text
    dot, _ = diagrams.drawing_texts(EXTRA)
    for line in ("go [if ready]", "go [else]", "kick [if not paused and not done]"):
        assert f"{line}\\l" in dot
    assert "tick [if a and b] [internal]" in dot


def test_rendering_without_graphviz_says_how_to_get_it_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    root = _copy_checkout(tmp_path / "repo")
    before = {p.name: p.read_bytes() for p in (root / "state_diagrams").iterdir()}
    (root / "state_diagrams" / "span_phases.dot").write_text("stale")
    monkeypatch.setenv("PATH", str(tmp_path))
    for argv in ([], ["--check"]):
        assert diagrams.main([*argv, "--root", str(root)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "apt-get install graphviz" in err
    assert (root / "state_diagrams" / "span_phases.dot").read_text() == "stale"
    after = {p.name: p.read_bytes() for p in (root / "state_diagrams").iterdir()}
    assert {k: v for k, v in after.items() if k != "span_phases.dot"} == {
        k: v for k, v in before.items() if k != "span_phases.dot"
    }


def test_readme_without_a_block_is_reported():
    with pytest.raises(RuntimeError, match=r"span_phases\.mmd"):
        diagrams.embed_in_readme("no diagrams here", diagrams.render_text())
