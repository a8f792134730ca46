"""The text outputs: :mod:`~megatron.trace.render.text.report` (``report``) and
:mod:`~megatron.trace.render.text.diff` (``diff``)."""
