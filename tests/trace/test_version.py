"""``megatron-trace --version`` and ``megatron.trace.__version__``.

Each case runs a child with ``PYTHONPATH`` at this source tree, plus, for an
"installed" case, a folder holding only a ``.dist-info`` of this project (what
pip leaves): its version is the one reported exactly when the metadata
belongs to the code that runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tomllib

import megatron.trace

REPO_ROOT = Path(__file__).resolve().parents[2]


def _child(*argv: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(REPO_ROOT), *([str(extra_path)] if extra_path else [])]
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        cwd=REPO_ROOT,
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


def test_from_a_source_tree_the_version_says_so() -> None:
    result = _child("-m", "megatron.trace", "--version")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"megatron-trace {megatron.trace.SOURCE_VERSION}+source\n"
    probe = _child("-c", "import megatron.trace as t; print(t.__version__)")
    assert probe.stdout == f"{megatron.trace.SOURCE_VERSION}+source\n"


def test_an_editable_install_of_this_tree_reports_its_metadata_version(tmp_path: Path) -> None:
    site = _dist_info(tmp_path / "site", "7.8.9", editable_at=REPO_ROOT)
    result = _child("-m", "megatron.trace", "--version", extra_path=site)
    assert (result.returncode, result.stdout) == (0, "megatron-trace 7.8.9\n")


def test_metadata_of_another_copy_is_not_this_code_s_version(tmp_path: Path) -> None:
    # An install elsewhere (its files not these), shadowed by this checkout on PYTHONPATH.
    site = _dist_info(tmp_path / "site", "7.8.9", editable_at=None)
    result = _child("-m", "megatron.trace", "--version", extra_path=site)
    assert result.stdout == f"megatron-trace {megatron.trace.SOURCE_VERSION}+source\n"


def test_version_stands_alone_and_the_help_lists_it() -> None:
    result = _child("-m", "megatron.trace", "--help")
    assert result.returncode == 0
    assert "--version" in result.stdout
    assert "__version__" in dir(megatron.trace)
