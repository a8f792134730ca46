"""The report as ``report --json`` prints it (:mod:`~megatron.trace.render.json.report`)."""
