"""What the pinned Megatron-LM does with ``--inprocess-restart`` and telemetry: documented.

NVIDIA Resiliency Extension (NVRx) 0.4.1, installed by ``tox -e upstream`` in a
folder of its own (``MEGATRON_LM_NVRX_PATH``) that only these jobs see: beside it
Megatron-LM fails at import (its ``dist_checkpointing`` reads a ``__version__``
0.4.1 lacks), so its checkpointing strategy is hidden here, as the other cases
never see NVRx at all. Each test shows one defect of Megatron-LM's path, as it
is at the pinned revision; ``megatron/training/README.md`` ("In-process restart
in Megatron-LM") says what the port would have to change, and this project's
trainer (``--inprocess-restart``, ``tests/inprocess``) does it. When a defect is
fixed upstream, its test fails: the README is then to be brought up to date.

1. The second ``pretrain()`` of a restart fails (``args is not initialized``: NVRx's
   finalize step, Megatron-LM's ``destroy_state``, clears the global arguments,
   which ``pretrain_gpt.py`` parses once), and the restarts go on past
   ``--inprocess-max-iterations``, which is parsed and never used.
2. ``pretrain()``'s ``inprocess_call_wrapper`` is never filled: NVRx passes its
   ``CallWrapper`` only to a parameter annotated with that class, so the
   rendezvous store is never prefixed per restart.
3. nemo-lens refuses a second ``setup_telemetry`` in a process, which the second
   ``pretrain()`` of a process calls.
4. No span records the fault, and the fault's way out of ``pretrain()`` shuts the
   tracer provider down (``_end_otel_job_spans``): forced past 3, a later cycle's
   spans are not exported.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from megatron_lm import (
    FAULT_AT,
    HIDE_PACKAGES,
    SITE_DIR,
    job_env,
    python_for_megatron,
    read_spans,
    start_pretrain_gpt,
)
from processes import kill_job

NVRX = os.environ.get("MEGATRON_LM_NVRX_PATH", "")

#: NVRx's options as Megatron-LM names them: soft, hard and barrier timeouts a CPU meets.
INPROCESS = (
    "--inprocess-restart",
    "--inprocess-max-iterations", "2",
    "--inprocess-granularity", "rank",
    "--inprocess-soft-timeout", "20",
    "--inprocess-hard-timeout", "30",
    "--inprocess-heartbeat-interval", "5",
    "--inprocess-heartbeat-timeout", "15",
    "--inprocess-barrier-timeout", "60",
    "--inprocess-completion-timeout", "60",
)  # fmt: skip


@pytest.fixture
def nvrx_path() -> str:
    if not (NVRX and Path(NVRX, "nvidia_resiliency_ext").is_dir()):
        pytest.fail(
            "MEGATRON_LM_NVRX_PATH names no NVRx install: tox -e upstream installs it",
            pytrace=False,
        )
    return NVRX


def _nvrx_env(tree: Path, nvrx: str) -> dict[str, str]:
    """What a job with NVRx needs beside the harness's: NVRx importable, its checkpointing
    hidden (Megatron-LM fails at import beside it), c10d's store warnings quiet."""
    return {
        "PYTHONPATH": os.pathsep.join([str(SITE_DIR), str(tree), nvrx]),
        HIDE_PACKAGES: "nvidia_resiliency_ext.checkpointing",
        "TORCH_CPP_LOG_LEVEL": "error",
    }


def _python(tree: Path, work: Path, nvrx: str, source: str) -> subprocess.CompletedProcess[str]:
    """``source`` run by Megatron-LM's interpreter in the tree, as its jobs run (telemetry
    on, the console exporter into ``work/spans.jsonl``)."""
    env = job_env(tree, work, env={**_nvrx_env(tree, nvrx), "RANK": "0", "WORLD_SIZE": "1"})
    return subprocess.run(
        [python_for_megatron(), "-c", textwrap.dedent(source)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_second_pretrain_fails_and_restarts_go_on_past_the_limit(trees, tmp_path, nvrx_path):
    """Defects 1 and 4, in a real job: a fault in the third training step; with the limit
    at 2 cycles, the cycles go on (each failing at once) until the test ends the job. No
    span says a fault ended the first cycle, and no later cycle exports any."""
    log = tmp_path / "log.txt"
    job = start_pretrain_gpt(
        trees.pristine,
        [*INPROCESS, "--save-interval", "2"],
        log=log,
        work_dir=tmp_path,
        train_iters=8,
        telemetry=True,
        env={**_nvrx_env(trees.pristine, nvrx_path), FAULT_AT: "3"},
    )
    failures = 0
    try:
        deadline = time.monotonic() + 240  # only ends a hang
        while failures < 4 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
            failures = log.read_text(errors="replace").count(
                "AssertionError('args is not initialized.')"
            )
    finally:
        kill_job(job)
    text = log.read_text(errors="replace")
    assert "fn_ex: RuntimeError('injected fault in train_step call 3')" in text, text[-3000:]
    # cycles 1, 2, 3, 4 each failed: --inprocess-max-iterations 2 stopped none of them
    assert failures >= 4, text[-3000:]
    assert "RestartAbort" not in text
    spans = read_spans(tmp_path / "spans.jsonl")
    assert [s["name"] for s in spans].count("megatron.startup") == 1  # the first cycle's alone
    assert [s for s in spans if s["name"] == "megatron.train"], "the first cycle's intervals"
    errors = [s["name"] for s in spans if s["status"]["status_code"] == "ERROR" or s.get("events")]
    assert errors == []  # nothing says the fault ended it
    reasons = [s["attributes"] for s in spans if "megatron.shutdown.reason" in s["attributes"]]
    assert reasons == []


def test_pretrain_s_call_wrapper_is_never_filled(trees, tmp_path, nvrx_path):
    """Defect 2: NVRx substitutes its ``CallWrapper`` for a parameter annotated with that
    class; ``pretrain()``'s ``inprocess_call_wrapper: Optional[Any]`` is not one."""
    done = _python(
        trees.pristine,
        tmp_path,
        nvrx_path,
        """
        import inspect
        from nvidia_resiliency_ext.inprocess import CallWrapper, param_utils
        from megatron.training.training import pretrain

        marker = object.__new__(CallWrapper)

        def passed(fn, name, args):
            args, kwargs = param_utils.substitute_param_value(fn, args, {}, {CallWrapper: marker})
            bound = inspect.signature(fn).bind(*args, **kwargs)
            return bound.arguments.get(name) is marker

        parameter = inspect.signature(pretrain).parameters["inprocess_call_wrapper"]
        print("annotation", parameter.annotation)
        print("filled", passed(pretrain, "inprocess_call_wrapper", [None] * 4))

        def annotated(call_wrapper: CallWrapper = None):
            pass

        print("annotated filled", passed(annotated, "call_wrapper", []))
    """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "annotation typing.Optional[typing.Any]" in lines
    assert "filled False" in lines
    assert "annotated filled True" in lines  # what NVRx does fill


def test_nemo_lens_refuses_the_second_cycle_s_telemetry(trees, tmp_path, nvrx_path):
    """Defect 3, and 4 forced past it: each ``pretrain()`` sets telemetry up
    (``global_vars._set_telemetry``); after NVRx's finalize (``destroy_state``) the next
    cycle's is refused. Forced past that (nemo-lens's record that it was set up cleared),
    the new handle exports nothing: the fault's ``_end_otel_job_spans`` shut the process's
    tracer provider down, OpenTelemetry refuses to replace it, and the flag that guards
    that shutdown stays set."""
    done = _python(
        trees.pristine,
        tmp_path,
        nvrx_path,
        """
        import sys
        sys.argv = ["pretrain_gpt.py", "--num-layers", "1", "--hidden-size", "64",
                    "--num-attention-heads", "4", "--seq-length", "64",
                    "--max-position-embeddings", "64", "--micro-batch-size", "1",
                    "--train-iters", "2", "--mock-data", "--tokenizer-type", "NullTokenizer",
                    "--vocab-size", "128"]
        from megatron.training import global_vars, training
        from megatron.training.arguments import parse_args
        from megatron.training.inprocess_restart import destroy_state

        args = parse_args(ignore_unknown_args=True)
        args.rank, args.world_size = 0, 1
        global_vars._set_telemetry(args)  # the first cycle's pretrain()
        training._end_otel_job_spans()  # its fault's way out of pretrain()
        destroy_state()  # NVRx's finalize, as Megatron-LM configures it
        try:
            global_vars._set_telemetry(args)  # the second cycle's pretrain()
        except RuntimeError as exc:
            print("refused:", exc)
        import nemo.lens.handle
        nemo.lens.handle._INITIALIZED = False  # forced past the refusal
        global_vars._set_telemetry(args)
        tracer = global_vars.get_telemetry().tracer
        tracer.start_span("span.of.the.second.cycle").end()
        global_vars.get_telemetry().shutdown()  # flushes whatever a live pipeline holds
        print("flag", training._otel_shutdown_done)
    """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: setup_telemetry() has already been initialised for this process." in (
        done.stdout
    ), done.stdout + done.stderr[-2000:]
    assert "flag True" in done.stdout.splitlines()
    names = [span["name"] for span in read_spans(tmp_path / "spans.jsonl")]
    assert "span.of.the.second.cycle" not in names, names
