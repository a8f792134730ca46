"""The trainer's additions to the shared lifecycle (``megatron/training/telemetry/lifecycle.py``).

How a run ended: the trainer's lifecycle calls a clean exit (``sys.exit(0)``, a
generator closing) no failure by the very rule the call-site spans use
(``megatron.core.telemetry.helpers.is_clean_exit``), so a span around a layer and
the run's own spans never disagree about one exit; a Ctrl-C is an ``interrupt``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron.core.telemetry.helpers import is_clean_exit
from megatron.training.telemetry.lifecycle import TrainerSpanPhases
from megatron.training.telemetry_spans import SpanPhases


def lifecycle_clean_exit(cause: BaseException) -> bool:
    return TrainerSpanPhases(None).ending(cause) is None


class _Quit(SystemExit):
    """A SystemExit of the caller's own (as a launcher may define)."""


class _Abort(BaseException):
    """An exception outside ``Exception``, as a framework's abort may be."""


@pytest.mark.parametrize(
    ("cause", "clean"),
    [
        (GeneratorExit(), True),
        (SystemExit(), True),
        (SystemExit(None), True),
        (SystemExit(0), True),
        (SystemExit(False), True),
        (_Quit(0), True),
        (SystemExit(1), False),
        (SystemExit(2), False),
        (SystemExit(True), False),
        (SystemExit("bye"), False),
        (SystemExit(""), False),
        (SystemExit(0.0), False),  # Python prints 0.0 and exits 1
        (_Quit(3), False),
        (KeyboardInterrupt(), False),
        (ValueError("nan loss"), False),
        (StopIteration(), False),
        (_Abort(), False),
    ],
    ids=repr,
)
def test_the_call_sites_and_the_lifecycle_say_the_same_of_each_exit(
    cause: BaseException, clean: bool
) -> None:
    assert is_clean_exit(cause) is clean
    assert lifecycle_clean_exit(cause) is clean


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)))
def test_they_agree_on_every_exit_code(code: object) -> None:
    """Whatever ``sys.exit`` is given (nothing, a status, a message), the two say the
    same, and clean exactly when the process would exit with status 0."""
    cause = SystemExit(code)
    # Python's own rule: None or an int (bool included) equal to 0 exits 0; anything
    # else is printed and exits 1, a float 0.0 too.
    status_zero = code is None or (isinstance(code, int) and code == 0)
    assert is_clean_exit(cause) is lifecycle_clean_exit(cause) is status_zero


@pytest.mark.parametrize(
    ("cause", "trainer", "shared"),
    [
        (
            KeyboardInterrupt(),
            ("interrupt", "KeyboardInterrupt"),
            ("exception", "KeyboardInterrupt"),
        ),
        (SystemExit(0), None, ("exception", "SystemExit")),
        (SystemExit(3), ("exception", "SystemExit"), ("exception", "SystemExit")),
        (ValueError("nan"), ("exception", "ValueError"), ("exception", "ValueError")),
        (_Abort(), ("exception", f"{__name__}._Abort"), ("exception", f"{__name__}._Abort")),
        (15, ("signal", "SIGTERM"), ("signal", "SIGTERM")),
        (1, ("signal", "SIGHUP"), ("signal", "SIGHUP")),
        (None, None, None),
    ],
    ids=repr,
)
def test_the_trainer_names_a_ctrl_c_and_a_clean_exit_the_shared_module_does_not(
    cause: object, trainer: tuple | None, shared: tuple | None
) -> None:
    """Megatron-LM's pretrain() unwinds Exception only, so the shared module needs no
    interrupt reason and no clean-exit rule; this trainer unwinds every BaseException."""
    assert TrainerSpanPhases(None).ending(cause) == trainer
    assert SpanPhases(None).ending(cause) == shared
