"""The ``megatron-trace`` command line: the entry point and one thin module per command.

:mod:`~megatron.trace.cli.main` holds the entry point and the one place that
turns a :class:`~megatron.trace_format.errors.TraceError` into its line and exit
status; :mod:`~megatron.trace.cli.options` the options every command shares.
"""
