"""Exports for trace viewers (``megatron-trace export``).

:mod:`~megatron.trace.render.export.write` (the command's entry point),
:mod:`~megatron.trace.render.export.chrome` (Chrome trace-event JSON),
:mod:`~megatron.trace.render.export.perfetto` (Perfetto's protobuf),
:mod:`~megatron.trace.render.export.flows` (the arrows between spans) and
:mod:`~megatron.trace.render.export.tracks` (the tracks' names and order).
"""
