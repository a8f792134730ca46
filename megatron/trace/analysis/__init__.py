"""What the model means: one module per question ``megatron-trace`` answers.

:mod:`~megatron.trace.analysis.goodput` (where the time went),
:mod:`~megatron.trace.analysis.stragglers`, :mod:`~megatron.trace.analysis.hangs`,
:mod:`~megatron.trace.analysis.liveness` (is the job still running) and
:mod:`~megatron.trace.analysis.check` (the lifecycle's rules). They read the
model and return data; printing is :mod:`megatron.trace.cli`'s.
"""
