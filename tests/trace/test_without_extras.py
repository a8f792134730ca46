"""Every command without each of the ``trace`` extra's packages, and without all of them.

Either a command works without the package (the same output: ``check``, ``report``,
``export --format chrome``, and the timeline without msgspec), or it says in one line
which extra to install and exits 2 (``timeline`` without plotly, ``export --format
perfetto`` without perfetto, a zstd-compressed file without zstandard). Here each
absence is made by blocking the import in a fresh interpreter; ``tox -e noextras``
runs the same tests where none of the packages is installed at all.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tracegen as g
from processes import subprocess_env

EXTRA = ("plotly", "zstandard", "msgspec", "perfetto")
INSTALL = "pip install 'megatron-telemetry-spans[trace]'"
_MAIN = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    if name: sys.modules[name] = None  # as if not installed\n"
    "from megatron.trace.cli.main import main\n"
    "raise SystemExit(main(sys.argv[2:]))\n"
)


def _run(blocked: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _MAIN, ",".join(blocked), *argv],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("noextras") / "traces.jsonl"
    return g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6))


ABSENCES = [(name,) for name in EXTRA] + [EXTRA]
NOW = ("--now", "2000000000")


@pytest.mark.parametrize("blocked", ABSENCES, ids=lambda b: "+".join(b))
@pytest.mark.parametrize("command", [("check",), ("report",), ("report", "--json")])
def test_reading_commands_give_the_same_answer(trace: Path, blocked, command) -> None:
    everything = _run((), *command, str(trace), *NOW)
    without = _run(blocked, *command, str(trace), *NOW)
    assert everything.returncode == 0, everything.stderr
    assert (without.returncode, without.stdout, without.stderr) == (0, everything.stdout, "")


@pytest.mark.parametrize("blocked", ABSENCES, ids=lambda b: "+".join(b))
def test_the_chrome_export_is_the_same_file(trace: Path, tmp_path: Path, blocked) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _run((), "export", str(trace), "-o", str(a), *NOW).returncode == 0
    without = _run(blocked, "export", str(trace), "-o", str(b), *NOW)
    assert without.returncode == 0, without.stderr
    assert a.read_bytes() == b.read_bytes()


def _one_line_naming_the_extra(result: subprocess.CompletedProcess[str], command: str) -> None:
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"megatron-trace {command}: error: ") and INSTALL in line, line


@pytest.mark.parametrize("blocked", [("perfetto",), EXTRA], ids=lambda b: "+".join(b))
def test_the_perfetto_export_names_the_extra(trace: Path, tmp_path: Path, blocked) -> None:
    out = tmp_path / "t.pftrace"
    result = _run(blocked, "export", "--format", "perfetto", str(trace), "-o", str(out))
    _one_line_naming_the_extra(result, "export")
    assert "perfetto package" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("blocked", [("plotly",), EXTRA], ids=lambda b: "+".join(b))
def test_the_timeline_names_the_extra(trace: Path, tmp_path: Path, blocked) -> None:
    out = tmp_path / "t.html"
    result = _run(blocked, "timeline", str(trace), "-o", str(out))
    _one_line_naming_the_extra(result, "timeline")
    assert "plotly package" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _zstd_frame(data: bytes) -> bytes:
    """``data`` as one zstd frame of one raw (stored) block: RFC 8878, by hand, so this
    test needs no zstandard to make the file it reads without zstandard."""
    assert 256 <= len(data) < 65536 + 256 and len(data) < 128 * 1024
    header = bytes([0x60]) + (len(data) - 256).to_bytes(2, "little")  # one segment, 2-byte size
    block = (1 | (0 << 1) | (len(data) << 3)).to_bytes(3, "little")  # last, raw, size
    return b"\x28\xb5\x2f\xfd" + header + block + data


@pytest.mark.needs_extras
def test_the_hand_made_frame_is_zstd() -> None:
    import zstandard

    data = b"x" * 300 + b"y" * 700
    assert zstandard.ZstdDecompressor().decompress(_zstd_frame(data)) == data


@pytest.mark.parametrize("blocked", [("zstandard",), EXTRA], ids=lambda b: "+".join(b))
def test_a_compressed_file_names_the_extra(trace: Path, tmp_path: Path, blocked) -> None:
    rotated = tmp_path / "traces.jsonl.1.zst"
    rotated.write_bytes(_zstd_frame(trace.read_bytes()[:60000]))
    result = _run(blocked, "report", str(rotated))
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "zstd-compressed" in line and "megatron-telemetry-spans[trace]" in line, line


@pytest.mark.needs_extras  # the page needs plotly: the tests above cover its absence
def test_the_timeline_without_msgspec_is_drawn(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    result = _run(("msgspec",), "timeline", str(trace), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert b"incarnation 1" in out.read_bytes()


def test_watch_without_prometheus_client_names_its_extra(trace: Path) -> None:
    """Not the trace extra's: the watch extra's one package, blocked here, in every env."""
    result = _run(("prometheus_client",), "watch", "--listen", "127.0.0.1:0", str(trace))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "megatron-trace watch: error: watch needs the prometheus_client package: "
        "pip install 'megatron-telemetry-spans[watch]'\n"
    )


@pytest.mark.parametrize(
    ("blocked", "message"),
    [
        (
            ("opentelemetry.proto",),
            "receive needs the opentelemetry-proto package",
        ),
        (("grpc",), "receive --grpc needs the grpcio package"),
    ],
)
def test_receive_without_its_extra_names_it(tmp_path: Path, blocked, message) -> None:
    """The receive extra's packages, blocked here, in every env: one line, nothing listens.
    Where the env has none of the extra (tox -e noextras), the line names the first
    package missing: opentelemetry-proto, which both transports need."""
    if importlib.util.find_spec("opentelemetry.proto") is None:
        message = "receive needs the opentelemetry-proto package"
    out = tmp_path / "out"
    result = _run(blocked, "receive", "--out", str(out), "--grpc", "127.0.0.1:0", "--http",
                  "127.0.0.1:0")  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"megatron-trace receive: error: {message}: "
        "pip install 'megatron-telemetry-spans[receive]'\n"
    )


@pytest.mark.parametrize("blocked", [("opentelemetry.proto",), ("grpc",)])
def test_watch_receive_without_the_receive_extra_names_it(tmp_path: Path, blocked) -> None:
    """``watch --receive`` needs the receive extra as ``receive`` does: one line, exit 2
    (where the watch extra itself is installed; without it, watch's own line comes first)."""
    pytest.importorskip("prometheus_client", reason="the watch extra: watch's own line first")
    out = tmp_path / "out"
    result = _run(blocked, "watch", "--receive", str(out), "--grpc", "127.0.0.1:0",
                  "--http", "127.0.0.1:0", "--listen", "127.0.0.1:0")  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("megatron-trace watch: error: receive")
    assert lines[0].endswith("pip install 'megatron-telemetry-spans[receive]'")
