"""Every key the benchmarks record, and its target.

A figure meets its target when it is at most the target; ``nan`` is a figure
measured with no target. Plain data, imported by ``run_benchmarks.py``.
"""

from __future__ import annotations

TARGETS = {
    "step_ratio_off": 2.0,
    "step_ratio_on": 2.0,
    "reroot_ratio": 1.5,
    "lifecycle_ratio": 1.3,
    "train_overhead_default": 1.01,
    "train_overhead_per_step": 1.05,
    "sigterm_exit_s": 1.0,
    "encode_ratio_vs_official": 0.7,
    "pipeline_cpu_ratio": 0.8,
    "report_s_per_million_spans": 30.0,
    "report_peak_mb_1m_spans": 200.0,
    "report_floor_ratio": 1.0,
    "check_floor_ratio": 1.2,
    "export_floor_ratio": 2.0,
    "export_perfetto_floor_ratio": 2.0,
    "report_fallback_floor_ratio": float("nan"),  # measured, no target
    "export_many_intervals_floor_ratio": 2.0,
    # the same file, every reader: independent of the number of intervals, as above
    "report_many_intervals_floor_ratio": 1.0,
    "check_many_intervals_floor_ratio": 1.2,
    "export_perfetto_many_intervals_floor_ratio": 2.0,
    "check_peak_mb_1m_spans": 300.0,
    "export_perfetto_size_ratio": 1.0,
    # with the communication group (the straggler split): as fast as any report
    "report_communication_floor_ratio": 1.0,
    # peak RSS at 4M spans / at 1M, the same shape: flat memory is about 1
    "report_peak_growth_4x_spans": 1.1,
    "check_peak_growth_4x_spans": 1.1,
    "export_peak_growth_4x_spans": 1.1,
    "export_perfetto_peak_growth_4x_spans": 1.1,
    "timeline_peak_growth_4x_spans": 1.1,
    # the timeline's lanes into their page: ours (msgspec for the bars) must beat plotly's
    "timeline_page_ratio_vs_plotly": 1.0,
    # the report's order statistics by selection over the columns' parts against numpy's
    # partition of the whole column: a small fraction of its memory, for a few passes' time
    "selection_peak_ratio_vs_partition": 0.25,
    "selection_time_ratio_vs_partition": float("nan"),  # measured, no target
}
