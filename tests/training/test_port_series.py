"""The port's patch series (``megatron/training/port_upstream/series.py``, ``parts/``),
without a Megatron-LM checkout: what the series is made of.

It ends in this project's own module and tests (a change to either that no
patch carries fails here); each patch's description states its behaviour
change and how it was tested; the first patch's module keeps to its budget;
every prefix passes its own tests, and each later patch's tests fail on the
module before it. On the real tree (``git am``
patch by patch, Megatron-LM's pytest, pretrain_gpt.py): ``tests/upstream``.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

from megatron.training import port_upstream
from megatron.training.port_upstream import series

REPO = Path(__file__).resolve().parents[2]


def test_the_series_ends_in_this_projects_module_and_tests():
    final = series.final_files()
    for dest, ours in ((series.MODULE_DEST, series.MODULE), (series.TESTS_DEST, series.TESTS)):
        assert final[dest] == series.HEADER + ours.read_bytes(), (
            f"the series ends in another {dest} than {ours.relative_to(REPO)}: carry the change "
            "in the patch it belongs to (python -m megatron.training.port_upstream.edit_series)"
        )


def _code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", 0), str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_the_first_patch_moves_the_lifecycle_in_at_most_250_code_lines(tmp_path):
    """Issue 62's budget for the refactor a maintainer reviews first: the pure move of
    Megatron-LM's pull request 6788 is 213 code lines, the block it removes 215."""
    modules: list[str] = []
    series.stages(lambda repo, _: modules.append((repo / series.MODULE_DEST).read_text()), tmp_path)
    counted = 'x = 1\n\n# a comment\ndef f():\n    """Doc."""\n    return (\n        1)\n'
    assert _code_lines(counted) == 4  # x = 1, def f():, return (, 1)
    assert _code_lines(modules[0]) <= 250, "patch 1's telemetry_spans.py grew past 250 code lines"


def test_each_patch_says_what_it_changes_and_how_it_was_tested():
    patches = series.patches()
    assert len(patches) == len(series.SITES) >= 2
    first, *changes = patches
    assert first.subject.startswith("training: move the job-level span lifecycle")
    assert "\nNo behaviour change" in first.body
    for patch in changes:
        assert patch.subject.startswith("telemetry_spans: "), patch.subject
        assert re.search(r"^Behaviour changes?\b", patch.body, re.M), patch.name
        assert "No behaviour change" not in patch.body, patch.name
    for patch in patches:
        assert re.search(r"^Testing: ", patch.body, re.M), patch.name
        assert len(patch.subject) <= 90 and not patch.subject.endswith("."), patch.subject
        too_long = [line for line in patch.body.splitlines() if len(line) > 76]
        assert too_long == [], patch.name


def test_the_call_sites_pass_what_each_patch_records():
    """The iteration from the patch that records intervals' iterations, the exception
    from the one that records why a run ended."""
    patches = series.patches()
    by_subject = {p.subject: p.sites for p in patches}
    iterations = next(p.number for p in patches if "iterations each" in p.subject)
    cause = next(p.number for p in patches if "why a run ended" in p.subject)
    for patch in patches:
        assert patch.sites.step_iteration is (patch.number >= iterations), patch.subject
        assert patch.sites.shutdown_cause is (patch.number >= cause), patch.subject
    assert len(by_subject) == len(patches)


def _stage_files(tmp_path: Path) -> list[dict[Path, bytes]]:
    """Each patch's module and tests, in order."""
    files: list[dict[Path, bytes]] = []

    def keep(repo: Path, patch: series.Patch) -> None:
        files.append(
            {dest: (repo / dest).read_bytes() for dest in (series.MODULE_DEST, series.TESTS_DEST)}
        )

    series.stages(keep, tmp_path / "stages")
    return files


def _pytest(root: Path, module: bytes, tests: bytes) -> subprocess.CompletedProcess:
    """The shipped tests of one stage against one stage's module, in a tree of their own."""
    for relative, data in ((series.MODULE_DEST, module), (series.TESTS_DEST, tests)):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for package in ("megatron", "megatron/training"):
        (root / package / "__init__.py").touch()
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--rootdir", str(root), str(root / series.TESTS_DEST)],
        cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def test_every_prefix_passes_its_tests_and_each_change_fails_the_tests_before_it(tmp_path):
    stages = _stage_files(tmp_path)
    module, tests = series.MODULE_DEST, series.TESTS_DEST
    for number, stage in enumerate(stages, 1):
        own = _pytest(tmp_path / f"own{number}", stage[module], stage[tests])
        assert own.returncode == 0, f"patch {number}:\n{own.stdout[-3000:]}{own.stderr[-2000:]}"
        assert re.search(r"^\d+ passed in", own.stdout.splitlines()[-1]), own.stdout[-500:]
        if number > 1:
            before = _pytest(tmp_path / f"before{number}", stages[number - 2][module], stage[tests])
            assert before.returncode != 0, f"patch {number}'s tests pass without it"
            assert re.search(r"\d+ (failed|error)", before.stdout.splitlines()[-1]), before.stdout


def test_the_series_needs_an_unported_checkout_and_an_empty_folder(tmp_path):
    checkout = tmp_path / "Megatron-LM"
    (checkout / "megatron" / "training").mkdir(parents=True)
    training = checkout / port_upstream.TRAINING
    training.write_text("from megatron.training.telemetry_spans import SpanPhases\n")
    (checkout / "pyproject.toml").write_text('[project.optional-dependencies]\notel = ["x"]\n')
    (checkout / port_upstream.GLOBAL_VARS).write_text("")

    def run(out: Path) -> subprocess.CompletedProcess:
        command = ["-m", "megatron.training.port_upstream", "--series", str(out), str(checkout)]
        return subprocess.run([sys.executable, *command], capture_output=True, text=True,
                              check=False, cwd=REPO)  # fmt: skip

    ported = run(tmp_path / "out")
    assert ported.returncode == 1
    assert ported.stderr.strip().splitlines() == [
        "port_upstream: megatron/training/training.py is ported already: the series applies "
        "to the original; nothing changed"
    ]
    assert not (tmp_path / "out").exists()
    training.write_text("def pretrain():\n    pass\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.patch").write_text("keep me\n")
    refused = run(busy)
    assert refused.returncode == 1
    assert "not an empty folder" in refused.stderr and "nothing changed" in refused.stderr
    assert [p.name for p in busy.iterdir()] == ["mine.patch"]
    assert (busy / "mine.patch").read_text() == "keep me\n"


def test_the_series_exports_as_a_repository_to_edit(tmp_path):
    """``edit_series export``: a commit per patch, each message the patch's description;
    ``import`` of it writes the same files (nothing edited: nothing changes)."""
    from megatron.training.port_upstream import edit_series

    repo = edit_series.export(tmp_path / "repo")
    log = series.run_git(repo, "log", "--format=%s", f"-{len(series.SITES)}")
    assert log.splitlines()[::-1] == [p.subject for p in series.patches()]
    again = str(tmp_path / "again")
    last = f"HEAD~{len(series.SITES)}"
    written = series.run_git(
        repo, "format-patch", "--zero-commit", "--no-signature", "-o", again, last
    )
    for name in written.split():
        part = series.PARTS / Path(name).with_suffix(".part").name
        assert Path(name).read_bytes() == part.read_bytes()
