"""What ``megatron-trace`` writes, one subpackage per kind of output.

:mod:`~megatron.trace.render.timeline` (the self-contained HTML timeline page),
:mod:`~megatron.trace.render.export` (Chrome trace-event JSON and Perfetto),
:mod:`~megatron.trace.render.text` (the report and diff as text) and
:mod:`~megatron.trace.render.metrics` (``watch``'s Prometheus endpoint and OTLP
push). :mod:`~megatron.trace.render.lanes` (one lane per process and rank) and
:mod:`~megatron.trace.render.output` (each file whole or not at all) serve the
first two.
"""
