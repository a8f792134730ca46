"""The trainer's telemetry, beside the training loop it observes.

:mod:`~megatron.training.telemetry.job_telemetry` (turns it on for a run),
:mod:`~megatron.training.telemetry.goodput_metrics` (live goodput gauges),
:mod:`~megatron.training.telemetry.grad_sync_spans` (gradient-sync spans),
:mod:`~megatron.training.telemetry.start_footprint` (what starting cost),
:mod:`~megatron.training.telemetry.trace_summary` (the end-of-run summary) and
:mod:`~megatron.training.telemetry.diagrams` (the lifecycle drawings).
The lifecycle itself, :mod:`megatron.training.telemetry_spans`, stays at the path
Megatron-LM's issue names.
"""
