"""``megatron-trace --version`` and ``megatron.trace.__version__``.

Each case runs a child with ``PYTHONPATH`` at a copy of this source tree's
``megatron/`` (a checkout that was built, as tox builds it, holds the build's own
``.egg-info`` beside it, which is this code's metadata), plus, for an
"installed" case, a folder holding only a ``.dist-info`` of this project (what
pip leaves): its version is the one reported exactly when the metadata
belongs to the code that runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import megatron.trace

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A source tree of this code with no metadata of any install beside it."""
    root = tmp_path / "src"
    shutil.copytree(
        REPO_ROOT / "megatron", root / "megatron", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def _child(
    source: Path, *argv: str, extra_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    path = [str(source), *([str(extra_path)] if extra_path else [])]
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        cwd=source,
        timeout=60,
    )


def _dist_info(root: Path, version: str, editable_at: Path | None) -> Path:
    info = root / f"megatron_telemetry_spans-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: megatron-telemetry-spans\nVersion: {version}\n"
    )
    if editable_at is not None:
        url = {"url": editable_at.as_uri(), "dir_info": {"editable": True}}
        (info / "direct_url.json").write_text(json.dumps(url))
    return root


def test_the_source_version_is_what_pyproject_declares() -> None:
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert declared == megatron.trace.SOURCE_VERSION


def test_from_a_source_tree_the_version_says_so(source: Path) -> None:
    result = _child(source, "-m", "megatron.trace", "--version")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"megatron-trace {megatron.trace.SOURCE_VERSION}+source\n"
    probe = _child(source, "-c", "import megatron.trace as t; print(t.__version__)")
    assert probe.stdout == f"{megatron.trace.SOURCE_VERSION}+source\n"


def test_an_editable_install_of_this_tree_reports_its_metadata_version(
    tmp_path: Path, source: Path
) -> None:
    site = _dist_info(tmp_path / "site", "7.8.9", editable_at=source)
    result = _child(source, "-m", "megatron.trace", "--version", extra_path=site)
    assert (result.returncode, result.stdout) == (0, "megatron-trace 7.8.9\n")


def test_metadata_of_another_copy_is_not_this_code_s_version(tmp_path: Path, source: Path) -> None:
    # An install elsewhere (its files not these), shadowed by this checkout on PYTHONPATH.
    site = _dist_info(tmp_path / "site", "7.8.9", editable_at=None)
    result = _child(source, "-m", "megatron.trace", "--version", extra_path=site)
    assert result.stdout == f"megatron-trace {megatron.trace.SOURCE_VERSION}+source\n"


def test_version_stands_alone_and_the_help_lists_it(source: Path) -> None:
    result = _child(source, "-m", "megatron.trace", "--help")
    assert result.returncode == 0
    assert "--version" in result.stdout
    assert "__version__" in dir(megatron.trace)
