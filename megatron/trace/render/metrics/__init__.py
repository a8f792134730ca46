"""``megatron-trace watch``'s metric outputs: the live figures as gauges.

:mod:`~megatron.trace.render.metrics.series` (each rank's series, declared once),
:mod:`~megatron.trace.render.metrics.prometheus` (the scrape endpoint) and
:mod:`~megatron.trace.render.metrics.otlp_push` (pushed to an OTLP collector).
"""
