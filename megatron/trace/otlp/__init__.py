"""The trace files themselves: finding, opening and decoding OTLP/JSON lines.

The lowest room of ``megatron-trace`` and the only one the writers share:
:mod:`~megatron.trace_format.files` (rank files, rotation, compression, pieces),
:mod:`~megatron.trace.otlp.decode` (one line into spans),
:mod:`~megatron.trace_format.records` (the flat span record),
:mod:`~megatron.trace.otlp.reader` (the streaming reader),
:mod:`~megatron.trace.otlp.spans` (a re-readable span source) and
:mod:`~megatron.trace.otlp.parallel` (several files, one process each).
It imports nothing of ours but :mod:`megatron.trace_format.semconv` and
:mod:`megatron.trace_format.errors`.
"""
