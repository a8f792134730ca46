"""Edit the port's patch series (``series.py``, ``parts/``) with git.

    python -m megatron.training.port_upstream.edit_series export DIR
    # in DIR: commit the change, `git rebase -i` it into the patch it belongs to,
    # reword that patch's description to state it
    python -m megatron.training.port_upstream.edit_series import DIR

``export`` writes a repository with a commit per patch (the two files the
port adds, at their Megatron-LM paths, each commit's message the patch's
description); ``import`` writes ``parts/`` from that repository's last
commits, one a patch. The project's own ``telemetry_spans.py`` and
``test_telemetry_spans.py`` must then equal what the series ends in (a test
says where they differ).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .series import PARTS, SITES, run_git, stages


def export(into: Path) -> Path:
    """The stored series as a repository at ``into``: a commit per patch, with only the
    two added files, for editing with git."""
    if into.exists() and any(into.iterdir()):
        raise SystemExit(f"edit_series export: {into} is not empty")
    with tempfile.TemporaryDirectory() as work:
        repo = stages(lambda repo, patch: None, Path(work))
        shutil.copytree(repo, into, dirs_exist_ok=True)
    return into


def import_(repo: Path) -> list[Path]:
    """``parts/`` written from ``repo``'s last commits, one a patch (as many as
    :data:`SITES` lists; the file names follow their subjects)."""
    with tempfile.TemporaryDirectory() as work:
        names = run_git(repo, "format-patch", "--zero-commit", "--no-signature", "-o", work,
                     f"HEAD~{len(SITES)}")  # fmt: skip
        for old in PARTS.glob("*.part"):
            old.unlink()
        for name in names.split():
            shutil.copy(name, PARTS / Path(name).with_suffix(".part").name)
    return sorted(PARTS.glob("*.part"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megatron.training.port_upstream.edit_series",
        description="Edit the port's patch series with git.",
    )
    parser.add_argument("verb", choices=["export", "import"])
    parser.add_argument("repo", type=Path, help="the repository to write (export) or read")
    args = parser.parse_args(argv)
    if args.verb == "export":
        print(f"series: a commit per patch in {export(args.repo)}")
    else:
        print(f"series: wrote {len(import_(args.repo))} parts in {PARTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
