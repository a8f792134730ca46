"""The batch trace model: spans grouped into processes, ranks and incarnations.

One module per concept: :mod:`~megatron.trace.model.incarnation` (the data types:
``Incarnation``, ``Trace``), :mod:`~megatron.trace.model.identity`
(which process and rank wrote a span, and the incarnation-split rule),
:mod:`~megatron.trace.model.builder` (``TraceBuilder``, ``load_trace``: one streaming
pass, pieces read in parallel merged), :mod:`~megatron.trace.model.process` (what the
builder keeps per process), :mod:`~megatron.trace.model.split` (a process's records
placed into incarnations), :mod:`~megatron.trace.model.ending` (how an incarnation
ended), :mod:`~megatron.trace.model.intervals` (each checkpoint interval's index and
iteration range) and :mod:`~megatron.trace.model.window` (a window cut out of a big
trace).
"""
