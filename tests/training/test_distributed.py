"""What the trainer prints reaches a console the ranks share a whole line at a time."""

from __future__ import annotations

import io

from megatron.training.distributed import print_lines


class _Writes(io.StringIO):
    """A stream that remembers each write, as an unbuffered pipe receives them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_line_is_one_write_and_the_text_is_print_s() -> None:
    """Under torchrun each rank's stdout is unbuffered and print() writes a line and its
    newline apart, so another rank's line could land between them (CI once read rank 0's
    summary on the end of rank 1's line)."""
    text = "telemetry written to t.jsonl\n  spans by name:\n    megatron.train  1"
    stream = _Writes()
    print_lines(text, stream)
    assert stream.writes == [
        "telemetry written to t.jsonl\n",
        "  spans by name:\n",
        "    megatron.train  1\n",
    ]
    printed = io.StringIO()
    print(text, file=printed)
    assert stream.getvalue() == printed.getvalue()
    single, empty = _Writes(), _Writes()
    print_lines("one line", single)
    print_lines("", empty)
    assert single.writes == ["one line\n"] and empty.writes == ["\n"]
