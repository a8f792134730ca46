"""``megatron-trace``: read a run's OTLP/JSON trace files back.

Subcommands (one module each, registered in :mod:`megatron.trace.cli.main`):
``check`` verifies the span lifecycle's invariants, ``report`` computes the
goodput report. :mod:`megatron.trace.model.trace` groups spans into ranks and
incarnations for all of them.
"""
