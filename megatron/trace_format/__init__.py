"""The trace format: what the writers and the reader of a trace share, and nothing more.

:mod:`~megatron.trace_format.semconv` (the vocabulary: every span name,
attribute, category and metric), :mod:`~megatron.trace_format.errors` (the one
error type, with its exit code), :mod:`~megatron.trace_format.files` (rank files,
rotation, compression, pieces), :mod:`~megatron.trace_format.records` (the
flat record of one span) and :mod:`~megatron.trace_format.words` (how their
messages count things). It imports nothing of ours, so ``megatron.core.telemetry``
and the trainer (the writers) and ``megatron-trace`` (the reader) all stand on it.
"""
