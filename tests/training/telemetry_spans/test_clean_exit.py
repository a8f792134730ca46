"""The two definitions of a clean exit agree: the lifecycle's and the call-site API's.

``megatron/training/telemetry_spans.py`` is copied byte for byte into Megatron-LM,
where only the standard library, ``transitions`` and (lazily) OpenTelemetry are
there to import, and ``megatron.core`` may not import ``megatron.training``; so
``megatron/core/telemetry/helpers.py`` keeps a twin of ``_is_clean_exit``. Both
decide whether an exception unwinding through a span is a failure (an
``exception`` event and ERROR status) or a clean end (``sys.exit(0)``, a
generator closing): a span around a layer and the run's own spans must never
disagree about the same exit. Here the twins are held equal, and to what a user
of ``sys.exit`` expects.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron.core.telemetry.helpers import _is_clean_exit as call_site_clean_exit
from megatron.training.telemetry_spans import _is_clean_exit as lifecycle_clean_exit


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
def test_the_twins_say_the_same_of_each_exit(cause: BaseException, clean: bool) -> None:
    assert call_site_clean_exit(cause) is clean
    assert lifecycle_clean_exit(cause) is clean


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)))
def test_the_twins_agree_on_every_exit_code(code: object) -> None:
    """Whatever ``sys.exit`` is given (nothing, a status, a message), the two say the
    same, and clean exactly when the process would exit with status 0."""
    cause = SystemExit(code)
    # Python's own rule: None or an int (bool included) equal to 0 exits 0; anything
    # else is printed and exits 1, a float 0.0 too.
    status_zero = code is None or (isinstance(code, int) and code == 0)
    assert call_site_clean_exit(cause) is lifecycle_clean_exit(cause) is status_zero
