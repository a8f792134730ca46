"""``python -m megatron.training.port_upstream``, on checkouts it must refuse.

The port applied to the real Megatron-LM tree (lines removed, a second run,
the byte-for-byte copy, Megatron-LM's own tests in the ported tree) is checked
by ``tox -e upstream`` (``tests/upstream``), which has that tree. Here: what
it does with a checkout it does not recognise (one line naming what it could
not find, nothing changed), and the lifecycle tests it adds to Megatron-LM
pass in this project too.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.training import port_upstream

REPO = Path(__file__).resolve().parents[2]


def _port(checkout: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron.training.port_upstream", str(checkout)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


#: ``_set_telemetry`` as Megatron-LM's global_vars.py has it, around the import the port
#: adds to.
SET_TELEMETRY = (
    "def _set_telemetry(args):\n"
    "    global _GLOBAL_TELEMETRY_HANDLE\n"
    "    try:\n"
    "        from nemo.lens import NemoLensConfig, setup_telemetry\n"
    "    except ImportError:\n"
    "        _GLOBAL_TELEMETRY_HANDLE = None\n"
    "        return\n"
)


def _checkout(tmp_path: Path, training: str) -> Path:
    root = tmp_path / "Megatron-LM"
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "training.py").write_text(training)
    (root / port_upstream.GLOBAL_VARS).write_text("import os\n\n\n" + SET_TELEMETRY)
    (root / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2.6.0"]\n\n'
        '[project.optional-dependencies]\notel = ["nemo-lens[sdk]"]\n'
    )
    return root


@pytest.mark.parametrize(
    ("training", "named"),
    [
        ("def pretrain():\n    pass\n", "`def _otel_telemetry_active(`"),
        ("def broken(:\n", "does not parse"),
    ],
    ids=["no_lifecycle", "syntax_error"],
)
def test_an_unrecognised_training_py_is_named_and_left_untouched(tmp_path, training, named):
    root = _checkout(tmp_path, training)
    before = _digest(root)
    result = _port(root)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0] and "nothing changed" in lines[0]
    assert "megatron/training/training.py" in lines[0]
    assert result.stdout == ""
    assert _digest(root) == before


def test_a_folder_that_is_no_checkout_is_named(tmp_path):
    result = _port(tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"port_upstream: {tmp_path}: could not find megatron/training/training.py; nothing changed"
    ]
    assert list(tmp_path.iterdir()) == []


DEP = '"transitions>=0.9.2,<0.10"'
CORE = '[project]\ndependencies = ["torch>=2.6.0", "numpy"]\n\n[project.optional-dependencies]\n'


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            CORE + 'otel = [\n    "nemo-lens[sdk]",\n]\ntraining = ["wandb"]\ndev = ["tqdm"]\n',
            CORE + f'otel = [\n    "nemo-lens[sdk]",\n    {DEP},\n]\ntraining = ["wandb"]\n'
            f'dev = ["tqdm", {DEP}]\n',
        ),
        (
            CORE + 'otel = ["nemo-lens[sdk]"]\n\n[tool.x]\ndev = ["y"]\n',
            CORE + f'otel = ["nemo-lens[sdk]", {DEP}]\n\n[tool.x]\ndev = ["y"]\n',
        ),
        (CORE + 'otel = ["transitions>=0.9"]\ndev = ["transitions"]\n', None),
        (CORE + "otel = []\n", CORE + f"otel = [{DEP}]\n"),
    ],
    ids=["otel_and_dev", "otel_only_dev_elsewhere", "already_there", "empty"],
)
def test_transitions_joins_the_telemetry_extras_not_megatron_cores_own(before, after):
    """Where Megatron-LM's telemetry users get nemo-lens and its SDK, and its tests'."""
    assert port_upstream.add_dependency(before) == (before if after is None else after)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[project]\ndependencies = ["torch"]\n', "`[project.optional-dependencies]`"),
        (CORE + 'dev = ["tqdm"]\n', "`otel = [...]` in [project.optional-dependencies]"),
        (CORE + 'otel = [\n    "nemo-lens"  # why\n]\n', "does not parse after adding"),
    ],
    ids=["no_extras", "no_otel_extra", "trailing_comment"],
)
def test_a_pyproject_it_cannot_edit_is_named(text, named):
    with pytest.raises(port_upstream.NotRecognised, match=re.escape(named)):
        port_upstream.add_dependency(text)


def test_telemetry_is_set_up_only_where_transitions_is_as_only_where_nemo_lens_is():
    """One line in _set_telemetry's ``try``, before the nemo-lens import (isort's order):
    without ``transitions`` telemetry is a no-op, as without nemo-lens. Again: unchanged."""
    text = "import os\n\n\n" + SET_TELEMETRY
    ported = port_upstream.needs_transitions(text)
    added = [line for line in ported.splitlines() if line not in text.splitlines()]
    assert added == [
        "        import transitions  # noqa: F401  # otel extra too (telemetry_spans.py): "
        "absent -> no-op"
    ]
    assert ported.index(added[0]) < ported.index("from nemo.lens import")
    assert ported.replace(added[0] + "\n", "") == text
    assert port_upstream.needs_transitions(ported) == ported
    assert len(added[0]) <= 100  # Megatron-LM's black line length


@pytest.mark.parametrize(
    "text",
    [
        "def _set_telemetry(args):\n    return None\n",
        "def other():\n    try:\n        from nemo.lens import NemoLensConfig, setup_telemetry\n"
        "    except ImportError:\n        pass\n\n\ndef _set_telemetry(args):\n    pass\n",
        "import os\n",
    ],
    ids=["no_import", "import_in_another_function", "no_function"],
)
def test_a_global_vars_py_it_cannot_edit_is_named(text):
    with pytest.raises(port_upstream.NotRecognised, match=r"global_vars\.py: could not find"):
        port_upstream.needs_transitions(text)


def test_the_files_it_adds_begin_with_megatron_lms_copyright_line():
    """Megatron-LM's header, then the module and the tests exactly as they are here."""
    header = port_upstream.HEADER.decode()
    assert header == "# Copyright (c) 2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.\n"
    for source in (port_upstream.MODULE, port_upstream.TESTS):
        assert not source.read_text().startswith("# Copyright")


def test_runs_as_a_module_of_its_package(tmp_path):
    """``python -m megatron.training.port_upstream`` (the package's __main__) with no checkout."""
    result = _port(tmp_path / "missing")
    assert result.returncode == 1
    assert "could not find megatron/training/training.py; nothing changed" in result.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "megatron.training.port_upstream"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert usage.returncode == 2
    assert "usage: python -m megatron.training.port_upstream" in usage.stderr


#: Run pytest with ``opentelemetry.sdk`` failing to import, as if not installed.
WITHOUT_SDK = """
import sys

class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Hidden())
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sdk", ["with_sdk", "without_sdk"])
def test_the_lifecycle_tests_it_adds_pass_here_too(tmp_path, sdk):
    """The file Megatron-LM gets as tests/unit_tests/training/test_telemetry_spans.py:
    every test passes, none skipped, with the OpenTelemetry SDK and without it."""
    runner = ["-m", "pytest"] if sdk == "with_sdk" else ["-c", WITHOUT_SDK]
    result = subprocess.run(
        [sys.executable, *runner, "-q", "-rs", "-p", "no:cacheprovider", str(port_upstream.TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in [\d.]+s", summary), summary  # none skipped or failed
    assert int(summary.split()[0]) >= 60
