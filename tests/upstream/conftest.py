"""``tox -e upstream``: this project's lifecycle inside Megatron-LM's own ``pretrain()``.

``MEGATRON_LM_DIR`` names a Megatron-LM checkout (``.ci/run``: the pinned one in
``../shared/upstream/``); it is never written to. The session copies it: one
copy stays pristine; for another, ``python -m megatron.training.port_upstream
--series`` writes the pull requests and ``git am`` applies them all (the
ported tree, which the tests run Megatron-LM's own ``pretrain_gpt.py`` in,
beside the pristine one, with nemo-lens's telemetry, which the tox environment
installs from ``NEMO_LENS_DIR``); a third is a git repository the series is
applied to as well, whose commits ``test_series.py`` checks out one by one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from megatron_lm import apply_series, copy_tree, port_checkout


@dataclass(frozen=True)
class Trees:
    """The checkout as given, and the same after the port."""

    source: Path
    pristine: Path
    ported: Path
    port_output: str  # what --series printed
    series_dir: Path  # the patches it wrote
    series_repo: Path  # a git repository of the checkout, the series applied commit by commit


def _checkout_from_env() -> Path:
    value = os.environ.get("MEGATRON_LM_DIR", "").strip()
    if not value:
        pytest.fail(
            "MEGATRON_LM_DIR is not set: point it at a Megatron-LM checkout "
            "(e.g. MEGATRON_LM_DIR=../shared/upstream/Megatron-LM tox -e upstream)",
            pytrace=False,
        )
    path = Path(value).resolve()
    if not (path / "megatron" / "training" / "training.py").is_file():
        pytest.fail(
            f"MEGATRON_LM_DIR={value}: no megatron/training/training.py there; "
            "it must be the top folder of a Megatron-LM checkout",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def trees(tmp_path_factory) -> Trees:
    try:
        import nemo.lens  # noqa: F401
    except ImportError:
        pytest.fail(
            "nemo-lens is not installed: tox -e upstream installs it from NEMO_LENS_DIR",
            pytrace=False,
        )
    source = _checkout_from_env()
    root = tmp_path_factory.mktemp("megatron-lm")
    pristine = copy_tree(source, root / "pristine")
    series_dir = root / "series"
    result = port_checkout(pristine, series=series_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    ported = apply_series(copy_tree(source, root / "ported"), series_dir)
    series_repo = apply_series(copy_tree(source, root / "series_repo"), series_dir)
    return Trees(source, pristine, ported, result.stdout, series_dir, series_repo)
