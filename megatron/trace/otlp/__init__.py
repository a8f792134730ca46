"""Reading the trace files: decoding OTLP/JSON lines, streaming, in parallel pieces.

:mod:`~megatron.trace.otlp.decode` (one line into spans),
:mod:`~megatron.trace.otlp.reader` (the streaming reader),
:mod:`~megatron.trace.otlp.spans` (a re-readable span source) and
:mod:`~megatron.trace.otlp.parallel` (several files, or pieces of one, one process
each, or on any executor). The files' naming, rotation and compression and the flat
span record are the writers' too: :mod:`megatron.trace_format`, the only thing of
ours this imports.
"""
