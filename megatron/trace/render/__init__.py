"""Pictures of a trace: the timeline page, Chrome trace-event JSON and Perfetto.

Each writer reads the model and the analyses and writes one output file,
whole or not at all (:mod:`~megatron.trace.render.output`).
"""
