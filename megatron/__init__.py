"""Megatron-style training with a job-level OpenTelemetry span lifecycle."""
