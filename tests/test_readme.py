"""The package READMEs say what the code does: the metrics they list, the trace tree they draw."""

from __future__ import annotations

import re
from pathlib import Path

from megatron.core.telemetry import training_metrics

MEGATRON = Path(__file__).resolve().parents[1] / "megatron"
# The metrics are the base layer's; the trace tree is what the trainer emits.
TELEMETRY_README = (MEGATRON / "core" / "telemetry" / "README.md").read_text(encoding="utf-8")
TRAINING_README = (MEGATRON / "training" / "README.md").read_text(encoding="utf-8")


def _paragraph(containing: str) -> str:
    (found,) = [p for p in TELEMETRY_README.split("\n\n") if containing in p]
    return found


def test_every_training_metric_is_listed_and_nothing_else():
    written = {
        value.removeprefix("megatron.training.")
        for name, value in vars(training_metrics).items()
        if name.startswith("MEGATRON_TRAINING_")
    }
    paragraph = _paragraph("`metrics.jsonl` beside it holds")
    listed = set(re.findall(r"`(?:megatron\.training)?\.(\w+)`", paragraph))
    assert listed == written
    # written only once positive, as Megatron-LM adds it: the README must say so
    assert re.search(r"once an\s+iteration\s+was\s+skipped", paragraph)


def _tree() -> list[tuple[int, str]]:
    """(depth, span name) for each line of the per_step trace tree."""
    block = TRAINING_README.split("## What the trace looks like", 1)[1].split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        found = re.search(r"(megatron\.[\w.]+|pre_startup)", line)
        if found:
            lines.append((found.start() // 4, found.group(1)))
    return lines


def test_the_trace_tree_nests_the_first_iteration_s_work_under_it():
    tree = _tree()
    first = next(i for i, (_, name) in enumerate(tree) if name == "megatron.train.first_iteration")
    depth = tree[first][0]
    assert tree[first - 1] == (depth - 1, "megatron.train.iteration")
    children = []
    for child_depth, name in tree[first + 1 :]:
        if child_depth <= depth:
            break
        if child_depth == depth + 1:
            children.append(name)
    assert children == ["megatron.train.forward_backward", "megatron.train.optimizer"]


ROOT_README = (MEGATRON.parent / "README.md").read_text(encoding="utf-8")


def test_the_top_level_readme_stays_a_guide():
    """At most 230 lines: detail belongs in the package READMEs it links to."""
    assert len(ROOT_README.splitlines()) <= 230
    for link in re.findall(r"\]\(((?:megatron|tests)/[^)#]+)", ROOT_README):
        assert (MEGATRON.parent / link).exists(), link


def test_the_ports_changes_to_megatron_lm_are_a_table_of_its_patches_with_reasons():
    """A row for each patch after the first (which changes no behaviour), in order."""
    from megatron.training.port_upstream import series

    section = ROOT_README.split("## Moving it into Megatron-LM", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == "| patch | behaviour change | why |"
    body = [row.strip("|").split(" | ") for row in rows[1:]]
    assert all(len(cells) == 3 and cells[2].strip() for cells in body), body
    assert [int(cells[0]) for cells in body] == [p.number for p in series.patches()[1:]]
    assert any("a lifecycle ends once" in cells[1] for cells in body)
