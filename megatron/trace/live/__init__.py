"""The live layer: ``megatron-trace watch``'s incremental view of a job still running.

Above the batch model and analyses, which know nothing of updates:
:mod:`~megatron.trace.live.follow` (tails the growing files),
:mod:`~megatron.trace.live.job` (the job's figures, recomputed only where new
spans landed).
"""
