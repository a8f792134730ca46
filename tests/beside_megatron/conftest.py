"""What the ``tox -e beside-megatron`` tests share: children that see only what is installed.

These tests run in an env where megatron-core 0.16.1 was installed first and
our wheel over it, as a Megatron-LM user installs us. Every check runs in a
child process with no ``PYTHONPATH`` of its own (so never this source tree:
the test imports ``megatron`` as a user's program would, from site-packages),
in a temporary folder as its working directory (``python -c`` puts that
folder first on ``sys.path``), plus a Megatron-LM-shaped checkout where a test
puts one on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import tracegen as g

CORE = "megatron-core"
OURS = "megatron-telemetry-spans"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RECORD_CHECK = HERE / "record_check.py"

try:
    distribution(CORE)
    distribution(OURS)
except PackageNotFoundError as missing:
    raise pytest.UsageError(
        f"tests/beside_megatron need megatron-core 0.16.1 and this package installed "
        f"(not found: {missing}): run them with `tox -e beside-megatron`"
    ) from None

# Each name -> its file; None when no such module is found; "needs X" when it is
# found but a module it imports (X) is not (any other import error fails the child).
# Run as ``python -c RESOLVE NAME...``.
RESOLVE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.import_module(name).__file__
    except ModuleNotFoundError as error:
        found[name] = None if error.name == name else f"needs {error.name}"
print(json.dumps(found))
"""


def child_env(pythonpath: Sequence[Path | str] = ()) -> dict[str, str]:
    """This environment without anything that changes what ``import megatron`` finds."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")
    }
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return env


class Beside:
    """Runs children in ``cwd`` with this env's interpreter (or ``python``)."""

    def __init__(self, cwd: Path, python: Path | str = sys.executable) -> None:
        self.cwd = cwd
        self.python = Path(python)
        # the console script pip wrote beside the interpreter, as a user runs it
        self.script = self.python.parent / "megatron-trace"

    def run(
        self, argv: Sequence[str | Path], pythonpath: Sequence[Path | str] = ()
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(arg) for arg in argv],
            cwd=self.cwd,
            env=child_env(pythonpath),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def ok(self, argv: Sequence[str | Path], pythonpath: Sequence[Path | str] = ()) -> str:
        """Run; assert exit status 0; stdout."""
        result = self.run(argv, pythonpath)
        assert result.returncode == 0, (argv, result.stdout, result.stderr)
        return result.stdout

    def using(self, python: Path) -> Beside:
        """The same, with another interpreter (a venv's)."""
        return Beside(self.cwd, python)

    def new_venv(self, path: Path, lend: Path) -> tuple[Beside, Path]:
        """A new venv at ``path`` (and one for it, and its site-packages folder) that
        borrows the packages of the site folder ``lend`` but the ``megatron`` folder,
        megatron-core's and our metadata, and pip: pip finds torch and the rest
        installed (unpacking torch takes a minute), while every ``megatron`` file and
        both distributions are installed into the venv's own site-packages."""
        self.ok([sys.executable, "-m", "venv", path])
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        own = path / "lib" / version / "site-packages"
        lent = path.parent / f"{path.name}-lent"
        lent.mkdir()
        for entry in lend.iterdir():
            name = entry.name.lower()
            if name in ("megatron", "__pycache__", "pip") or name.startswith(
                ("megatron_core-", "megatron_telemetry_spans-", "pip-")
            ):
                continue
            if entry.suffix != ".pth":  # (a .pth works only in a site folder)
                (lent / entry.name).symlink_to(entry)
        (own / "lent.pth").write_text(f"{lent}\n")
        return self.using(path / "bin" / "python"), own

    def pip(self, *args: str | Path) -> str:
        """``python -m pip ARGS`` with torch pinned by the CI's constraint file
        (2.13.0, the CPU wheel: unpinned, pip takes a multi-GB CUDA build)."""
        result = subprocess.run(
            [str(self.python), "-m", "pip", *map(str, args)],
            cwd=self.cwd,
            env={**child_env(), "PIP_CONSTRAINT": str(REPO_ROOT / ".ci" / "constraints.txt")},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def code(self, source: str, *args: str | Path, pythonpath: Sequence[Path | str] = ()) -> str:
        return self.ok([self.python, "-c", source, *args], pythonpath)

    def resolve(self, *names: str, pythonpath: Sequence[Path | str] = ()) -> dict[str, str | None]:
        """Where each module is imported from in a fresh child (see ``RESOLVE``)."""
        return json.loads(self.code(RESOLVE, *names, pythonpath=pythonpath))

    def damaged(self, dist: str, pythonpath: Sequence[Path | str] = ()) -> tuple[int, list[str]]:
        """How many files ``dist``'s RECORD lists, and those no longer as recorded."""
        found = json.loads(self.ok([self.python, RECORD_CHECK, dist], pythonpath))
        return found["files"], found["damaged"]

    def trace_works(self, trace: Path, pythonpath: Sequence[Path | str] = ()) -> None:
        """``megatron-trace check`` and ``report --json`` read ``trace`` (one
        incarnation of 6 one-second iterations after a 2 s startup) correctly."""
        assert self.script.is_file(), self.script
        checked = self.ok([self.script, "check", trace], pythonpath)
        assert checked.startswith("ok: 14 spans, 1 incarnation on 1 rank, 0 violations")
        reported = self.ok([self.script, "report", "--json", trace], pythonpath)
        report = json.loads(reported.splitlines()[-1])  # the text, then the JSON, last
        assert report["goodput_s"] == 6.0
        assert report["badput_s"]["startup"] == 2.0
        assert [inc["ended"] for inc in report["incarnations"]] == ["shutdown"]


@pytest.fixture
def beside(tmp_path: Path) -> Beside:
    work = tmp_path / "cwd"
    work.mkdir()
    return Beside(work)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return g.write(tmp_path / "traces.jsonl", g.lifecycle(0))


@pytest.fixture
def our_source(tmp_path: Path) -> Path:
    """A copy of what our wheel is built from: ``pip install`` of this tree itself
    would leave a ``build/`` folder in it, whose files the next build ships."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT / "megatron", source / "megatron", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    return source


@pytest.fixture
def site() -> Path:
    """The site-packages folder both distributions were installed into."""
    ours = Path(distribution(OURS).locate_file("")).resolve()
    assert Path(distribution(CORE).locate_file("")).resolve() == ours
    return ours


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A tree shaped like a Megatron-LM source checkout: ``megatron`` a namespace
    (no ``__init__.py``), ``megatron/core`` and ``megatron/training`` regular packages."""
    root = tmp_path / "Megatron-LM"
    files = {
        "megatron/core/__init__.py": "from megatron.core import parallel_state\n",
        "megatron/core/parallel_state.py": "def get_data_parallel_rank():\n    return 0\n",
        "megatron/training/__init__.py": "",
        "megatron/training/training.py": "def pretrain(*args, **kwargs):\n    pass\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert not (root / "megatron" / "__init__.py").exists()
    return root
