"""``megatron-trace``: read a job's trace files back, with nothing but the files."""
