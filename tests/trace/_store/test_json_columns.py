"""The timeline's bar columns: JSON arrays written a chunk at a time, read back whole."""

from __future__ import annotations

import json

import pytest

from megatron.trace._store import spill
from megatron.trace._store.json_columns import JsonColumns, script_safe

VALUES = ["plain", "</script><script>alert(1)</script>", "\u2028 \u2029 日本", "", 'a"b\\c']


def _array(columns: JsonColumns, name: str) -> bytes:
    return b"".join(columns.array(name))


@pytest.mark.parametrize("on_disk", [True, False])
def test_each_column_reads_back_as_the_json_of_its_values(monkeypatch, on_disk: bool) -> None:
    if not on_disk:  # no temporary file can be written: the chunks stay in memory
        monkeypatch.setattr(spill, "_UNWRITABLE", [OSError("read-only TMPDIR")])
    columns = JsonColumns(chunk_values=2)
    numbers = [0, -0.38, 1.5e-06, 12345678901, 2.25]
    for text, number in zip(VALUES, numbers, strict=True):
        columns.append("text", text)
        columns.append("number", number)
    assert (columns.count("text"), columns.count("number"), columns.count("none")) == (5, 5, 0)
    for name, values in (("text", VALUES), ("number", numbers)):
        data = _array(columns, name)
        assert json.loads(data) == values
        assert data == _array(columns, name)  # and again, the same
    assert _array(columns, "none") == b"[]"


def test_a_column_is_safe_inside_a_script() -> None:
    columns = JsonColumns()
    for text in VALUES:
        columns.append("text", text)
    data = _array(columns, "text")
    for unsafe in (b"<", b">", b"/", "\u2028".encode(), "\u2029".encode()):
        assert unsafe not in data
    assert "日本".encode() in data  # raw UTF-8, as the page declares
    assert script_safe(b'"</x>"') == b'"\\u003c\\u002fx\\u003e"'
