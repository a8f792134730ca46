"""``megatron-trace`` works under ``python -OO``, which strips every docstring.

A subcommand that built its ``--help`` from its module's ``__doc__`` crashed
there before it printed anything, so each one is started the way a user
would, in a fresh interpreter with ``-OO``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from processes import subprocess_env

from megatron.trace.cli.main import COMMANDS, build_parser

SUBCOMMANDS = list(COMMANDS)
COLUMNS = "100"  # argparse wraps to the terminal: the same width in and out of process


def _help_under_oo(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-OO", "-m", "megatron.trace", *argv, "--help"],
        capture_output=True,
        text=True,
        env=subprocess_env({"COLUMNS": COLUMNS}),
        timeout=60,
    )


def _help_here(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The help this interpreter (docstrings kept) prints for ``argv``."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_every_subcommand_is_covered() -> None:
    assert SUBCOMMANDS == ["check", "report", "timeline", "export", "diff", "watch", "receive"]


@pytest.mark.parametrize(
    "argv", [[], *([c] for c in SUBCOMMANDS)], ids=["megatron-trace", *SUBCOMMANDS]
)
def test_help_under_python_OO_is_the_usual_help(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", COLUMNS)
    result = _help_under_oo(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == _help_here(argv, capsys)
    usage = " ".join(["usage: megatron-trace", *argv])
    assert result.stdout.startswith(usage)
    description = result.stdout.split("\n\n")[1]  # usage, description, arguments
    assert len(description) > 30 and not description.startswith(("positional", "options"))


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_is_plain_text_without_docstring_markup(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help_here([command], capsys)
    assert "``" not in text and ":func:" not in text and ":mod:" not in text
    # help assembled from pieces ("with --receive: " + "the ...") says no word twice
    assert not re.search(r"\b([a-z]+)\s+\1\b", text), text
    description = text.split("\n\n")[1]
    assert len(description.split()) > 8  # says what the command does


def test_a_reader_that_stops_early_ends_it_quietly(tmp_path) -> None:
    """``megatron-trace check FILE | head``: no traceback, no message, SIGPIPE's status."""
    import tracegen

    path = tracegen.write(tmp_path / "traces.jsonl", tracegen.lifecycle(0))
    torn = tracegen.line(tracegen.lifecycle(0)[:2], pid=99)[:-40]
    with path.open("a") as file:
        file.write("".join(torn + "\n" for _ in range(3000)))  # a note for each
    child = subprocess.Popen(
        [sys.executable, "-m", "megatron.trace", "check", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline()  # the reader takes a line (the notes are 400 KB) ...
    child.stdout.close()  # ... and goes away
    with child.stderr:
        errors = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141
    assert errors == ""


def test_a_subcommand_imports_only_what_it_runs(tmp_path) -> None:
    """``report`` on a small file does not wait for the exporters, the timeline or the
    OpenTelemetry SDK to import (a third of its start once)."""
    import tracegen

    path = tracegen.write(tmp_path / "traces.jsonl", tracegen.lifecycle(0))
    probe = (
        "import sys\n"
        "from megatron.trace.cli.main import main\n"
        f"status = main(['report', {str(path)!r}])\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('megatron', 'opentel')))))\n"
        "raise SystemExit(status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=subprocess_env()
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.splitlines()[-1].split())
    assert "megatron.trace.cli.report" in loaded
    unused = {
        "megatron.trace.render.export.write",
        "megatron.trace.render.timeline.write",
        "megatron.trace.analysis.check",
    }
    assert not loaded & unused
    assert not any(name.startswith("opentelemetry") for name in loaded)
