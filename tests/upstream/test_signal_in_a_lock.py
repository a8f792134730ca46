"""Megatron-LM, ported: a hard SIGTERM that lands while nemo-lens holds a lock.

nemo-lens's ``_OpenSpanCloser`` takes its lock in ``on_end``, for every span that
ends. CPython may run a signal handler right there, on the main thread that
holds it; the exit path ends the open interval, which runs ``on_end`` again and
waits for that lock. ``telemetry_spans.py`` acts only once the main thread has
left telemetry code, so the job still ends its spans and dies of the signal.
"""

from __future__ import annotations

from megatron_lm import SIGNAL_IN_LOCK, run_pretrain_gpt


def test_a_hard_sigterm_inside_nemo_lens_span_closer_ends_the_spans_and_the_job(trees, tmp_path):
    run = run_pretrain_gpt(
        trees.ported,
        ["--save-interval", "2"],
        work_dir=tmp_path,
        train_iters=20,
        telemetry=True,
        span_groups="per_step",
        env={SIGNAL_IN_LOCK: "SIGTERM:25"},
        timeout=300.0,  # only ends a hang
    )
    assert "landing SIGTERM inside _OpenSpanCloser.on_end" in run.stderr, run.describe()
    assert run.returncode == -15, run.describe()
    intervals = [span for span in run.spans if span["name"] == "megatron.train"]
    assert intervals, run.describe()
    ending = intervals[-1]["attributes"]
    assert (ending["megatron.shutdown.reason"], ending["error.type"]) == ("signal", "SIGTERM")
    assert "megatron.startup" in run.names()
