"""Trace files as log rotation leaves them: plain, gzip and zstd read alike, told by content.

The reader must give the same requests whatever the compression, whatever
the file is called (logrotate's ``delaycompress`` and hand renames keep
names that lie), and say in one line what is wrong when it cannot.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import zstandard

from megatron.trace.otlp.reader import iter_requests
from megatron.trace_format.files import CompressedTraceError, iter_lines

LINES = [json.dumps({"resourceSpans": [], "n": n}) + "\n" for n in range(200)]


def write(path: Path, how: str) -> Path:
    data = "".join(LINES).encode()
    if how == "gzip":
        data = gzip.compress(data)
    elif how == "zstd":
        # two frames, as `zstd -c part >> file` leaves a file appended to
        half = len(data) // 2
        packer = zstandard.ZstdCompressor()
        data = packer.compress(data[:half]) + packer.compress(data[half:])
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("how", ["plain", "gzip", "zstd"])
def test_every_compression_reads_the_same_lines_whatever_the_name(tmp_path, how) -> None:
    path = write(tmp_path / "traces.jsonl.1", how)  # the name says nothing of the format
    assert [line.decode() for line in iter_lines(path)] == LINES
    assert [request["n"] for _, _, request in iter_requests(path)] == list(range(200))


def test_zstd_without_zstandard_says_what_to_install(tmp_path, monkeypatch) -> None:
    path = write(tmp_path / "traces.jsonl.2.zst", "zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(CompressedTraceError) as raised:
        list(iter_lines(path))
    assert str(raised.value).startswith(f"{path}: a zstd-compressed trace")
    assert "pip install zstandard" in str(raised.value)


@pytest.mark.parametrize("how", ["gzip", "zstd"])
def test_a_cut_off_compressed_file_is_an_error_naming_it(tmp_path, how) -> None:
    path = write(tmp_path / "traces.jsonl.1", how)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CompressedTraceError, match=f"{path}: the {how[:4]}.* data is cut off"):
        list(iter_lines(path))
