"""What the model means: one module per question ``megatron-trace`` answers.

The report (:mod:`~megatron.trace.analysis.goodput` assembles it, typed by
:mod:`~megatron.trace.analysis.report`) from the accounting
(:mod:`~megatron.trace.analysis.accounting`: where the time went), wasted progress
(:mod:`~megatron.trace.analysis.wasted`), where each incarnation resumed
(:mod:`~megatron.trace.analysis.resumed`), the iteration figures
(:mod:`~megatron.trace.analysis.iteration_stats`), the windows
(:mod:`~megatron.trace.analysis.windows`), :mod:`~megatron.trace.analysis.stragglers`,
:mod:`~megatron.trace.analysis.hangs` and
:mod:`~megatron.trace.analysis.checkpoint_advice`; besides it
:mod:`~megatron.trace.analysis.liveness` (is the job still running),
:mod:`~megatron.trace.analysis.sightings` (what a killed incarnation's metric points say)
and :mod:`~megatron.trace.analysis.bounds` (what the files can only bound),
:mod:`~megatron.trace.analysis.check` (the lifecycle's rules),
:mod:`~megatron.trace.analysis.diff` and :mod:`~megatron.trace.analysis.gates`.
They read the model and return data; printing is :mod:`megatron.trace.render`'s.
"""
