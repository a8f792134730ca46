"""The README's performance table is written from a benchmarks results file.

No benchmark runs here: a results file shaped as ``run_benchmarks.py --json``
writes it goes through ``tests/benchmarks/table.py``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"


def _load(name: str) -> ModuleType:
    # by path: tests/benchmarks is not a package, and its modules are not on sys.path
    spec = importlib.util.spec_from_file_location(f"_benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


table = _load("table")
targets = _load("targets")


def _results() -> dict:
    """A full run's results file, every key of TARGETS, one of them missing its target."""
    results = {}
    for index, (key, target) in enumerate(targets.TARGETS.items()):
        has_target = target == target  # nan: measured, no target
        value = (0.9 * target if has_target else 3.4) if key != "lifecycle_ratio" else 2.63
        results[key] = {
            "value": value,
            "target": target if has_target else None,
            "meets": value <= target if has_target else None,
            "unit": targets.unit(key),
            "description": targets.DESCRIPTIONS[key],
            "ours": f"{index} ms | ours",
            "baseline": "(absolute)",
        }
    return {
        "run": {
            "date": "2026-12-03T06:40:19+00:00",
            "commit": "8619c68846275425ae2f66b2cd468cac555520b8",
            "dirty": False,
            "python": "3.11.7",
            "torch": "2.13.0+cpu",
            "packages": {"opentelemetry-sdk": "1.45.2", "msgspec": None},
            "cpus": 2,
            "platform": "Linux",
            "sections": ["step"],
            "quick": False,
            "seconds": 700,
        },
        "results": results,
    }


README = """# Project

## Performance

Prose before.

<!-- benchmarks:begin -->
| key | median |
|---|---|
| `old` | 1.0 |
<!-- benchmarks:end -->

Prose after, with `step_ratio_off` in it.
"""


def test_every_target_has_its_description_and_unit() -> None:
    assert set(targets.DESCRIPTIONS) == set(targets.TARGETS)
    assert set(targets.UNITS) <= set(targets.TARGETS)
    for key, text in targets.DESCRIPTIONS.items():
        assert text.strip() and "\n" not in text, key


def test_the_block_is_replaced_and_nothing_else() -> None:
    block = table.render(_results())
    new = table.replace_block(README, block)
    before, rest = new.split(table.BEGIN + "\n")
    inside, after = rest.split(table.END + "\n")
    assert before == README.split(table.BEGIN)[0]
    assert after == README.split(table.END + "\n")[1]
    assert inside == "\n" + block + "\n"
    assert "`old`" not in new


def test_the_table_has_a_row_for_every_key_and_names_the_misses() -> None:
    block = table.render(_results())
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(targets.TARGETS)
    (lifecycle,) = [row for row in rows if row.startswith("| `lifecycle_ratio`")]
    assert "| 2.630 | ≤ 2 | **no** |" in lifecycle
    assert "1 of" in block and "miss it: `lifecycle_ratio`" in block
    assert "commit `8619c6884627`" in block
    assert "\\| ours" in block  # a cell's | does not split the row
    (fallback,) = [row for row in rows if row.startswith("| `report_fallback_floor_ratio`")]
    assert "| — | — |" in fallback  # no target, nothing met or missed


def test_writing_again_changes_nothing(tmp_path: Path) -> None:
    results, readme = tmp_path / "results.json", tmp_path / "README.md"
    results.write_text(json.dumps(_results()))
    readme.write_text(README)
    assert table.write_table(results, readme, targets.TARGETS)
    once = readme.read_text()
    assert not table.write_table(results, readme, targets.TARGETS)
    assert readme.read_text() == once
    assert table.replace_block(once, table.render(_results(), "results.json")) == once


@pytest.mark.parametrize(
    "text",
    [
        "# no markers\n",
        f"{table.BEGIN}\nonly the first\n",
        f"{table.END}\n{table.BEGIN}\n",
        f"{table.BEGIN}\n{table.END}\n{table.BEGIN}\n{table.END}\n",
    ],
)
def test_without_one_pair_of_markers_one_clear_error(text: str) -> None:
    with pytest.raises(table.TableError, match="the table goes between a line"):
        table.replace_block(text, "block\n")


def test_a_partial_run_makes_no_table() -> None:
    document = _results()
    del document["results"]["step_ratio_on"]
    with pytest.raises(table.TableError, match=r"missing: step_ratio_on; not in targets.py: none"):
        table.check_keys(document, targets.TARGETS, "results.json")


def test_the_command_says_one_line_and_exits_2_without_markers(tmp_path: Path) -> None:
    results, readme = tmp_path / "results.json", tmp_path / "README.md"
    results.write_text(json.dumps(_results()))
    readme.write_text("# no markers\n")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "table.py"), str(results), "--readme", str(readme)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "benchmarks:begin" in done.stderr
    assert readme.read_text() == "# no markers\n"

    readme.write_text(README)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "table.py"), str(results), "--readme", str(readme)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "table written" in done.stdout
    assert "| `sigterm_exit_s` |" in readme.read_text()
