"""Installed after megatron-core 0.16.1 (issue 30): it stays whole, and both work.

megatron-core's wheel ships ``megatron/core/__init__.py`` (a regular package)
and no ``megatron/__init__.py``; ours ships ``megatron/core/telemetry/``,
``megatron/training/``, ``megatron/trace_format/`` and ``megatron/trace/``. pip overwrites another
distribution's file without a word, so a file of ours at one of its places
would replace megatron-core's, and ``pip uninstall`` of us would delete it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from importlib.metadata import distribution
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Beside

CORE, OURS = "megatron-core", "megatron-telemetry-spans"

# Where our files may go: beside megatron-core's, never among them.
OUR_HOMES = (
    "megatron/core/telemetry/",
    "megatron/training/",
    "megatron/trace_format/",
    "megatron/trace/",
)


def _record(dist: str) -> Path:
    (record,) = [f for f in distribution(dist).files or [] if f.name == "RECORD"]
    return Path(distribution(dist).locate_file(record))


def test_megatron_core_was_installed_first_and_we_import_from_site_packages(
    beside: Beside, site: Path
) -> None:
    # what the other tests show only means something in this order: us over it
    assert _record(CORE).stat().st_mtime_ns < _record(OURS).stat().st_mtime_ns
    found = beside.resolve(
        "megatron.core", "megatron.core.telemetry", "megatron.trace_format", "megatron.trace"
    )
    assert found == {
        "megatron.core": str(site / "megatron/core/__init__.py"),
        "megatron.core.telemetry": str(site / "megatron/core/telemetry/__init__.py"),
        "megatron.trace_format": str(site / "megatron/trace_format/__init__.py"),
        "megatron.trace": str(site / "megatron/trace/__init__.py"),
    }


def test_every_file_of_megatron_core_is_as_its_record_says(beside: Beside) -> None:
    count, damaged = beside.damaged(CORE)
    assert count > 400  # the wheel's 450 files (less the dist-info's) and their bytecode
    assert damaged == []


def test_megatron_core_and_our_modules_import_side_by_side(beside: Beside, site: Path) -> None:
    out = beside.code(
        "import json, megatron.core\n"
        "from megatron.core import InferenceParams\n"
        "import megatron.core.telemetry, megatron.training.telemetry_spans as spans\n"
        "print(json.dumps([megatron.core.__version__, InferenceParams.__module__, spans.__file__]))"
    )
    version, home, spans = json.loads(out.splitlines()[-1])
    assert version == "0.16.1"
    assert home.startswith("megatron.core.inference")
    assert spans == str(site / "megatron/training/telemetry_spans.py")


def test_megatron_trace_works(beside: Beside, trace: Path) -> None:
    beside.trace_works(trace)


def test_our_wheel_ships_no_file_of_megatron_core() -> None:
    core = {str(f) for f in distribution(CORE).files or []}
    ours = {str(f) for f in distribution(OURS).files or []}
    assert "megatron/core/__init__.py" in core  # what a file of ours must not replace
    assert ours & core == set()
    # and no megatron/__init__.py either: it would shadow a checkout's namespace
    modules = {name for name in ours if name.startswith("megatron/")}
    assert modules and all(name.startswith(OUR_HOMES) for name in modules), sorted(
        name for name in modules if not name.startswith(OUR_HOMES)
    )


def test_the_record_check_finds_a_changed_and_a_missing_file(
    beside: Beside, tmp_path: Path
) -> None:
    # a distribution of two files whose RECORD holds the hashes of what was installed
    base = tmp_path / "site"
    (base / "fake").mkdir(parents=True)
    info = base / "fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake\nVersion: 1.0\n")
    lines = ["fake-1.0.dist-info/METADATA,,", "fake-1.0.dist-info/RECORD,,"]
    for name, text in (("a.py", b"x = 1\n"), ("b.py", b"y = 2\n")):
        (base / "fake" / name).write_bytes(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=")
        lines.append(f"fake/{name},sha256={digest.decode()},{len(text)}")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    assert beside.damaged("fake", pythonpath=[base]) == (4, [])
    (base / "fake" / "a.py").write_text("x = 3\n")
    (base / "fake" / "b.py").unlink()
    assert beside.damaged("fake", pythonpath=[base]) == (
        4,
        ["fake/a.py: changed", "fake/b.py: missing"],
    )
