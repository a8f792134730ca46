"""The training entry point, its loop, and the job-level span lifecycle."""

from megatron.training.requirements import join_core_telemetry

# megatron.core.telemetry also where megatron-core's own megatron/core shadows this
# project's (an editable install beside megatron-core): see requirements.py.
join_core_telemetry()
