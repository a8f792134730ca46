"""The checked-in drawings must be what the live transition tables draw now."""

import shutil
from pathlib import Path

import pytest

from megatron.training import diagrams
from megatron.training.telemetry_spans import ExitHooks, SpanPhases

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_dot_is_installed():
    # The SVGs are rendered by Graphviz; CI installs it. Fail loudly, never skip.
    assert shutil.which("dot"), "Graphviz 'dot' is required: apt-get install graphviz"


def test_state_diagrams_match_the_transition_tables():
    stale = diagrams.drift(REPO_ROOT)
    assert stale == [], f"regenerate with `tox -e diagrams`: {stale}"


def test_every_trigger_appears_in_its_drawing():
    files = diagrams.render()
    for name, table in (("span_phases", SpanPhases), ("exit_hooks", ExitHooks)):
        dot = files[f"{name}.dot"]
        mermaid = files[f"{name}.mmd"]
        for transition in table.TRANSITIONS:
            assert transition["trigger"] in dot
            assert transition["trigger"] in mermaid


def test_drift_is_detected(tmp_path, monkeypatch):
    """A table change without regenerating must fail the check."""
    (tmp_path / "state_diagrams").mkdir()
    for name, text in diagrams.render().items():
        (tmp_path / "state_diagrams" / name).write_text(text)
    (tmp_path / "README.md").write_text((REPO_ROOT / "README.md").read_text())
    assert diagrams.drift(tmp_path) == []

    extra = {"trigger": "resume", "source": "shutdown", "dest": "job"}
    changed = diagrams._Drawing(
        "span_phases", "SpanPhases", SpanPhases.STATES, (*SpanPhases.TRANSITIONS, extra), "job"
    )
    monkeypatch.setattr(diagrams, "DRAWINGS", (changed, diagrams.DRAWINGS[1]))
    stale = diagrams.drift(tmp_path)
    assert {"span_phases.dot", "span_phases.svg", "span_phases.mmd", "README.md"} <= set(stale)


def test_readme_without_a_block_is_reported():
    with pytest.raises(RuntimeError, match=r"span_phases\.mmd"):
        diagrams.embed_in_readme("no diagrams here", diagrams.render())
