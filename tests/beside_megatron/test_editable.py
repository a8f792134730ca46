"""``pip install -e`` of this project after megatron-core: the trainer still finds its telemetry.

megatron-core's ``megatron/core`` is a regular package, so an editable install
(which leaves our ``megatron/core/telemetry/`` in the source tree instead of
merging it into megatron-core's folder) used to end every trainer start with
``No module named 'megatron.core.telemetry'``. ``megatron.training`` now points
the import system at the tree's copy when no other finder has it
(``megatron/training/requirements.py``). Proven as a user meets it: a new venv,
megatron-core installed first, this tree (a copy) editable over it, then a real
training run with telemetry on and ``megatron-trace`` reading what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Beside

# megatron.training first: importing it is what installs the fallback (a program that
# imports megatron.core.telemetry before anything of megatron.training still fails).
_WHERE = """
import json, megatron.training.telemetry_spans as spans, megatron.core, megatron.core.telemetry
print(json.dumps([megatron.core.__file__, megatron.core.telemetry.__file__, spans.__file__]))
"""

TINY = (
    "--mock-data", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
    "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "4", "--otel-enabled",
    "--otel-span-groups", "per_step",
)  # fmt: skip


def test_an_editable_install_after_megatron_core_trains_with_telemetry(
    beside: Beside, site: Path, our_source: Path, tmp_path: Path
) -> None:
    user, own = beside.new_venv(tmp_path / "venv", lend=site)
    user.pip("install", "-q", "megatron-core==0.16.1")
    user.pip("install", "-q", "-e", our_source)
    assert not (own / "megatron/core/telemetry").exists()  # editable: nothing merged

    core, telemetry, spans = json.loads(user.code(_WHERE).splitlines()[-1])
    assert core == str(own / "megatron/core/__init__.py")  # megatron-core's, untouched
    assert telemetry == str(our_source / "megatron/core/telemetry/__init__.py")
    assert spans == str(our_source / "megatron/training/telemetry_spans.py")

    assert user.ok([user.script, "--version"]) == "megatron-trace 0.1.0\n"  # its metadata

    pretrain = user.python.parent / "megatron-pretrain"
    user.ok([pretrain, *TINY])
    trace = beside.cwd / "telemetry" / "traces.jsonl"
    checked = user.ok([user.script, "check", trace])
    assert checked.startswith("ok: ") and ", 0 violations" in checked.splitlines()[0]
    report = json.loads(user.ok([user.script, "report", "--json", trace]).splitlines()[-1])
    assert [inc["ended"] for inc in report["incarnations"]] == ["shutdown"]
    assert report["iterations"]["count"] == 4
