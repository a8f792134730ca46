"""The live layer: the incremental view of a job still running, for ``megatron-trace
watch`` and for the trainer's own goodput gauges.

Above the batch model and analyses, which know nothing of updates:
:mod:`~megatron.trace.live.follow` (tails the growing files),
:mod:`~megatron.trace.live.growing` (the trace finished again and again, and what
changed between two finishes), :mod:`~megatron.trace.live.revision` (which
incarnation is which across finishes, and whether it changed),
:mod:`~megatron.trace.live.facts` (interval facts kept between finishes),
:mod:`~megatron.trace.live.accounting` and :mod:`~megatron.trace.live.stragglers`
(the goodput accounting and the straggler scores, at the cost of what changed),
:mod:`~megatron.trace.live.job` (the job's figures, recomputed only where new
spans landed) and :mod:`~megatron.trace.live.process` (one process's accounting
from its own spans, for the trainer's gauges). They read the model through its
public views only.
"""
