"""The shared exit hooks (``ExitHooks`` in ``telemetry_spans.py``), as Megatron-LM runs them.

Megatron-LM's own installer, which they replace, hooked SIGTERM alone, acted at the
first SIGTERM only (a flush under ``--exit-signal-handler``, else ending and
exporting the span tree), always passed the signal on, and caught ``ValueError``
and ``OSError`` when it could not install the handler. The process is faked
(``tests/support/fake_process.py``); the trainer's own hooks are
``tests/training/telemetry/test_trainer_exit_hooks.py``.
"""

from __future__ import annotations

import os
import signal

import pytest
from fake_handles import FakeHandle, ForbiddenHandle
from fake_process import PreviousHandler
from lifecycle_spec import TRAIN

from megatron.training.telemetry_spans import ExitHooks, SpanPhaseError


def in_interval(lifecycles, handle):
    phases = lifecycles.new(handle, save_interval=2)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()
    phases.step(0)
    return phases


def test_only_sigterm_is_hooked_and_atexit_registered_once(fake_process, lifecycles):
    hooks = ExitHooks()
    for _ in range(3):
        hooks.attach(in_interval(lifecycles, FakeHandle()))
    assert hooks.state == "installed"
    assert fake_process.atexit_calls == [hooks.process_exit]
    assert fake_process.signal_calls == [(signal.SIGTERM, hooks.handle_sigterm)]


def test_nothing_is_installed_for_a_handle_that_does_not_export(fake_process, lifecycles):
    hooks = ExitHooks()
    hooks.attach(lifecycles.new(None))
    hooks.attach(lifecycles.new(ForbiddenHandle(is_exporting=False)))
    assert hooks.state == "uninstalled"
    assert fake_process.atexit_calls == [] and fake_process.signal_calls == []


def test_a_hard_sigterm_terminates_once_then_only_chains(fake_process, lifecycles):
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks = ExitHooks()
    hooks.attach(phases)

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert hooks.state == "signalled"
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1
    handle.recorder.assert_all_ended_exactly_once()
    assert handle.one(TRAIN).attributes["error.type"] == "SIGTERM"
    assert previous.calls == [(signal.SIGTERM, None, "terminated")]

    hooks.handle_sigterm(signal.SIGTERM, None)
    hooks.process_exit()
    assert len(handle.shutdown_calls) == 1
    assert len(previous.calls) == 2, "a later SIGTERM is still passed on"


def test_the_process_that_survives_a_hard_sigterm_trains_on_recording_nothing(
    fake_process, lifecycles
):
    """Previous disposition SIG_IGN: the hook ends and exports the spans, the process
    lives, and the loop's later triggers (even its own shutdown) record nothing."""
    fake_process.previous = signal.SIG_IGN
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    hooks = ExitHooks()
    hooks.attach(phases)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert fake_process.resends() == []
    ended = list(handle.recorder.end_order)
    for iteration in range(1, 6):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    hooks.process_exit()
    assert phases.state == "terminated"
    assert handle.recorder.end_order == ended
    assert len(handle.shutdown_calls) == 1


def test_a_graceful_sigterm_flushes_once_and_the_trainer_shuts_down(
    fake_process, lifecycles, tracer_provider
):
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    drain = PreviousHandler(lambda: phases)
    fake_process.previous = drain
    hooks = ExitHooks()
    hooks.attach(phases, graceful=True)

    hooks.handle_sigterm(signal.SIGTERM, None)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert tracer_provider.flushes == [5000], "Megatron-LM flushes at the first SIGTERM only"
    assert phases.state == "interval"
    assert [call[2] for call in drain.calls] == ["interval", "interval"]
    phases.end_train()
    phases.shutdown()
    hooks.process_exit()  # the atexit fallback after the trainer's own shutdown
    assert phases.state == "shutdown"
    assert len(handle.shutdown_calls) == 1


def test_graceful_is_the_flag_alone(fake_process, lifecycles, tracer_provider):
    """As in Megatron-LM: under --exit-signal-handler the hook flushes whatever the
    previous disposition (Megatron-LM installs its drain handler before)."""
    fake_process.previous = signal.SIG_DFL
    handle = FakeHandle()
    hooks = ExitHooks()
    hooks.attach(in_interval(lifecycles, handle), graceful=True)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert len(tracer_provider.flushes) == 1
    assert handle.shutdown_calls == []
    assert fake_process.resends() == [("kill", os.getpid(), signal.SIGTERM)]


@pytest.mark.parametrize("error", [ValueError, OSError])
def test_a_handler_that_cannot_be_installed_leaves_the_atexit_fallback(
    fake_process, lifecycles, monkeypatch, error
):
    def refuse(signum, handler):
        raise error("signal only works in main thread")

    monkeypatch.setattr(signal, "signal", refuse)
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    hooks = ExitHooks()
    hooks.attach(phases)
    assert hooks.state == "installed"
    assert fake_process.atexit_calls == [hooks.process_exit]
    hooks.process_exit()
    assert phases.state == "terminated"
    handle.recorder.assert_all_ended_exactly_once()


def test_exit_paths_never_raise_where_the_training_path_would(fake_process, lifecycles):
    """After the trainer's own shutdown, its triggers raise; the hooks' do not."""
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    hooks = ExitHooks()
    hooks.attach(phases)
    phases.end_train()
    phases.shutdown()
    with pytest.raises(SpanPhaseError, match="'shutdown' in state 'shutdown'"):
        phases.shutdown()
    hooks.handle_sigterm(signal.SIGTERM, None)
    hooks.process_exit()
    phases.flush()
    phases.terminate()
    assert phases.state == "shutdown"
    assert len(handle.shutdown_calls) == 1
