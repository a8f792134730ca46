"""The timeline page (``megatron-trace timeline``).

:mod:`~megatron.trace.render.timeline.write` (the command's entry points),
:mod:`~megatron.trace.render.timeline.data` (the bars from the model),
:mod:`~megatron.trace.render.timeline.page` (the plotly figure and the HTML),
:mod:`~megatron.trace.render.timeline.ranks` (the per-rank panel) and
:mod:`~megatron.trace.render.timeline.summary` (the goodput summary above it).
"""
