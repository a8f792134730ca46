"""The trace model: spans grouped into processes, ranks and incarnations.

:mod:`~megatron.trace.model.trace` builds it in one streaming pass (and
merges the pieces read in parallel); :mod:`~megatron.trace.model.intervals`
gives each checkpoint interval its index and iteration range;
:mod:`~megatron.trace.model.window` cuts a window out of a big trace.
"""
