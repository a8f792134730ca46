"""The port's edit of Megatron-LM's ``megatron/training/global_vars.py``: telemetry
is set up only where ``transitions`` is installed, as only where nemo-lens is.

``_set_telemetry`` imports nemo-lens in a ``try`` and leaves telemetry a no-op
(``get_telemetry()`` None) where the import fails. ``transitions`` comes with
nemo-lens in the ``otel`` extra; importing it in the same ``try`` makes the pair
one requirement, so a run never exports without the job-level spans, their exit
hooks and the final shutdown, which ``telemetry_spans.py`` runs on it. One line is
added; a file whose ``try`` is not found as expected is not recognised.
"""

from __future__ import annotations

from pathlib import Path

from .training_py import NotRecognised

GLOBAL_VARS = Path("megatron/training/global_vars.py")

_NEMO_LENS = "        from nemo.lens import NemoLensConfig, setup_telemetry\n"
_TRY = "    try:\n" + _NEMO_LENS
#: Sorted as Megatron-LM's isort sorts a block (``import`` before ``from``).
_TRANSITIONS = (
    "        import transitions  # noqa: F401"
    "  # otel extra too (telemetry_spans.py): absent -> no-op\n"
)


def needs_transitions(text: str) -> str:
    """``global_vars.py`` whose ``_set_telemetry`` also needs ``transitions`` (unchanged
    where it does already)."""
    if "    try:\n" + _TRANSITIONS + _NEMO_LENS in text:
        return text
    function = text.find("\ndef _set_telemetry(")
    anchor = text.find(_TRY, function)
    following = text.find("\ndef ", function + 1)
    if function < 0 or anchor < 0 or (0 <= following < anchor):
        raise NotRecognised(
            f"{GLOBAL_VARS}: could not find `{_TRY.strip()}` in _set_telemetry(); "
            "the port knows the revision that imports nemo-lens there"
        )
    cut = anchor + len("    try:\n")
    return text[:cut] + _TRANSITIONS + text[cut:]
