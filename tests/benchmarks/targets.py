"""Every key the benchmarks record: its target, and what it measures in one line.

A figure meets its target when it is at most the target; ``nan`` is a figure
measured with no target. Plain data, imported by ``run_benchmarks.py`` (which
writes all three into its results file) and by ``table.py`` (which turns that
file into tests/benchmarks/README.md's table); ``tests/test_benchmark_table.py`` holds the dicts
to the same keys, so a new key is a target here and a line of the table.
"""

from __future__ import annotations

TARGETS = {
    "step_ratio_off": 2.0,
    "step_ratio_on": 2.0,
    # A reroot goes through transitions' own public dispatch (the file is the same in
    # Megatron-LM, which may not depend on a private hook): it happens once per
    # checkpoint interval, so these bound that dispatch, not a per-iteration cost
    # (the per-pass cost is step_ratio_*, the whole run's train_overhead_*).
    "reroot_ratio": 2.0,
    "lifecycle_ratio": 2.0,
    # the same, over Megatron-LM's own flag-based helpers (re-enacted)
    "reroot_ratio_vs_upstream": 2.0,
    "lifecycle_ratio_vs_upstream": 1.5,
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
    # reading on a Dask cluster: about as fast as the local pool on as many workers, and
    # a piece's summary grows by the iteration columns' 24 bytes an iteration (+1 of slack)
    "cluster_report_ratio": 1.3,
    "cluster_bytes_per_piece": 25.0,
    # watch: no dearer per span than report, flat in the file's length
    "watch_cpu_per_span_ratio": 1.2,
    "watch_rss_growth_4x": 1.1,
    # receive: the receiver's CPU per span over the OTLP protobufs' decoding alone (the
    # floor: what any receiver of these bodies pays), with 16 exporters sending at once
    # (decode, convert, JSON-encode and append: about 65-105 on the machine of the table;
    # through json_format.MessageToDict it was about 220)
    "receive_grpc_per_step_cpu_ratio": 150.0,
    "receive_grpc_default_cpu_ratio": 150.0,
    "receive_http_per_step_cpu_ratio": 150.0,
    "receive_http_default_cpu_ratio": 150.0,
    # goodput over time and run against run (issue 33): windows cost little over the
    # report, and a diff about two reports
    "report_window_ratio": 1.1,
    "diff_ratio": 2.2,
    # a long history whose truth is known (issue 40): weeks, hundreds of kills, 8 ranks; its
    # lines hold one span each beside a 900-byte resource, which the floor only parses
    "report_long_history_floor_ratio": 1.2,
    "report_long_history_peak_mb": 200.0,
    # the metrics beside a killed job's trace (issue 51): read from the end near each kill,
    # so a week of them costs a few blocks a kill (about 1.2 on the machine of the table)
    "report_metrics_week_ratio": 1.5,
    # an in-process restart (issue 63) against a relaunch after the same fault, from the
    # traces: the restart gap, and the gap with the next incarnation's startup (back to
    # training). NVRx waits --inprocess-last-call-wait (1 s) for other faults and a barrier;
    # a relaunch pays torchrun's teardown and start, the interpreter and the imports
    # (0.27 quiet, 0.54 on a loaded machine where the relaunch's gap shrank to 3 s)
    "inprocess_restart_gap_ratio": 0.75,
    "inprocess_back_to_training_ratio": 0.5,
}


#: What each key measures, one line: ours, then what it is over.
DESCRIPTIONS = {
    "step_ratio_off": "`SpanPhases.step()` on a non-boundary pass, telemetry off, over an empty "
    "method call",
    "step_ratio_on": "`SpanPhases.step()` on a non-boundary pass, telemetry on, over an empty "
    "method call",
    "reroot_ratio": "one boundary `step()` (its `reroot`), over the raw SDK calls for the same "
    "two spans, link and attributes",
    "lifecycle_ratio": "`start_job` … `shutdown`, 10,000 passes, `save_interval` 100, over "
    "hand-written raw SDK calls",
    "reroot_ratio_vs_upstream": "one boundary `step()` (its `reroot`), over Megatron-LM's "
    "flag-based helper for it "
    "(re-enacted in `tests/benchmarks/upstream_helpers.py`)",
    "lifecycle_ratio_vs_upstream": "`start_job`, 4 `record_phase`, … `shutdown`, 10,000 passes, "
    "`save_interval` 100, over Megatron-LM's flag-based helpers for the same spans",
    "train_overhead_default": "the demo model's ms/iteration with the `default` groups, over "
    "telemetry off (interleaved runs)",
    "train_overhead_per_step": "the demo model's ms/iteration with the `per_step` groups, over "
    "telemetry off",
    "sigterm_exit_s": "hard SIGTERM to process exit with 10,000 spans queued (absolute)",
    "encode_ratio_vs_official": "CPU to turn one `per_step` export batch (513 spans) into its "
    "OTLP/JSON line: our encoder over the official `opentelemetry-exporter-otlp-json-common`",
    "pipeline_cpu_ratio": "process CPU per exported span, `managed_span` → our batch processor → "
    "our JSONL file, over raw SDK spans → `BatchSpanProcessor` → the official `FileSpanExporter`",
    "report_s_per_million_spans": "`report` in-process on a synthetic `per_step` trace of 1M "
    "spans, per million spans (absolute)",
    "report_peak_mb_1m_spans": "peak RSS (`VmHWM`) of that report, in a fresh process",
    "report_floor_ratio": "`megatron-trace report` as a whole process on a two-rank `per_step` "
    "file of 1M spans, over the floor: `json.loads` of every line, a process of its own",
    "check_floor_ratio": "`megatron-trace check` on the same file, over the same floor",
    "export_floor_ratio": "`export --format chrome` on the same file, over the same floor",
    "export_perfetto_floor_ratio": "`export --format perfetto` on the same file, over the same "
    "floor",
    "report_fallback_floor_ratio": "`report` without msgspec (the stdlib fallback), over the same "
    "floor (no target)",
    "export_many_intervals_floor_ratio": "`export --format chrome` on a file as big with an "
    "interval every 4 iterations, over `json.loads` of that file",
    "report_many_intervals_floor_ratio": "`report` on that file of many intervals, over its floor",
    "check_many_intervals_floor_ratio": "`check` on that file of many intervals, over its floor",
    "export_perfetto_many_intervals_floor_ratio": "`export --format perfetto` on that file of "
    "many intervals, over its floor",
    "check_peak_mb_1m_spans": "peak RSS of `check` on the 1M-span file, of its biggest process",
    "export_perfetto_size_ratio": "the protobuf export's size, over the Chrome JSON of the same "
    "file",
    "report_communication_floor_ratio": "`report` on a two-rank file of 1M spans with the "
    "`communication` group too (the straggler split runs), over `json.loads` of that file",
    "report_peak_growth_4x_spans": "`report`'s peak RSS at 4M spans, over the same shape at 1M "
    "(`communication` group too)",
    "check_peak_growth_4x_spans": "`check`'s peak RSS at 4M spans, over the same at 1M",
    "export_peak_growth_4x_spans": "`export --format chrome`'s peak RSS at 4M spans, over the same "
    "at 1M",
    "export_perfetto_peak_growth_4x_spans": "`export --format perfetto`'s peak RSS at 4M spans, "
    "over the same at 1M",
    "timeline_peak_growth_4x_spans": "`timeline`'s peak RSS at 4M spans, over the same at 1M",
    "timeline_page_ratio_vs_plotly": "the timeline's lanes (a file with an interval every 4 "
    "iterations) from the read trace into their page, over plotly's own figure and `to_html`",
    "selection_peak_ratio_vs_partition": "the median and p90 of 4M iteration durations selected a "
    "radix digit at a time over the spilled columns' parts: peak memory (tracemalloc) over "
    "`np.partition` of the whole column",
    "selection_time_ratio_vs_partition": "the same selection's time, over `np.partition`'s (no "
    "target)",
    "cluster_report_ratio": "`report` of 64 rank files (230 MB) with `--scheduler` on a "
    "2-worker Dask `LocalCluster` started beforehand, over `--jobs 2` (the local pool), each "
    "timed in a process of its own",
    "cluster_bytes_per_piece": "bytes a worker's summary of one piece (`report`'s map step, "
    "serialized as Dask sends it) grows by per iteration: a one-rank file at 4x the "
    "iterations, as many checkpoint intervals, over 1x. A call reads a run of pieces and "
    "sends back their summaries merged, about the sum of theirs (the note: a run of both)",
    "watch_cpu_per_span_ratio": "CPU seconds per span appended that `watch`'s follower and live "
    "model spend (a synthetic `per_step` file grown in 200 chunks, a scrape's figures every 10), "
    "over `report --jobs 1`'s per span on the same file",
    "watch_rss_growth_4x": "peak RSS of watching a file grown to 4x the spans over one grown to "
    "1x (the same chunks, a scrape's figures every 8), each in a process of its own",
    "receive_grpc_per_step_cpu_ratio": (
        "CPU seconds per span of one `receive` process (/proc: user + system, its startup "
        "excluded) taking 16 exporters' requests at once over gRPC (4 jobs of 4 ranks, "
        "Megatron-LM's `per_step` span groups re-enacted, 512 spans a request as the SDK "
        "batches them, protobuf bodies), over parsing them with the OTLP protobufs alone"
    ),
    "receive_grpc_default_cpu_ratio": (
        "CPU seconds per span of one `receive` process (/proc: user + system, its startup "
        "excluded) taking 16 exporters' requests at once over gRPC (4 jobs of 4 ranks, "
        "Megatron-LM's `default` span groups re-enacted, 512 spans a request as the SDK batches"
        " them, protobuf bodies), over parsing them with the OTLP protobufs alone"
    ),
    "receive_http_per_step_cpu_ratio": (
        "CPU seconds per span of one `receive` process (/proc: user + system, its startup "
        "excluded) taking 16 exporters' requests at once over OTLP/HTTP (4 jobs of 4 ranks, "
        "Megatron-LM's `per_step` span groups re-enacted, 512 spans a request as the SDK "
        "batches them, protobuf bodies), over parsing them with the OTLP protobufs alone"
    ),
    "receive_http_default_cpu_ratio": (
        "CPU seconds per span of one `receive` process (/proc: user + system, its startup "
        "excluded) taking 16 exporters' requests at once over OTLP/HTTP (4 jobs of 4 ranks, "
        "Megatron-LM's `default` span groups re-enacted, 512 spans a request as the SDK batches"
        " them, protobuf bodies), over parsing them with the OTLP protobufs alone"
    ),
    "report_window_ratio": "`report --window 1h` of the 1M-span file (two ranks, a SIGKILL and "
    "a resume each), over plain `report` of it, each a process of its own, interleaved",
    "diff_ratio": "`diff` of two 1M-span files of that shape, over one `report` of one of them",
    "report_long_history_floor_ratio": "`report --json --jobs 2` of the ground truth's long "
    "history (14 days, 8 ranks, 300 SIGKILLs at random points, a slow rank, the last batch of "
    "each kill lost; about 670 MB), over `json.loads` of every line of it, each a process of "
    "its own",
    "report_long_history_peak_mb": "peak RSS of that report, of its biggest process",
    "report_metrics_week_ratio": "`report --json` of a week of a two-rank job (`default` span "
    "groups, 40 SIGKILLs) with its `metrics.jsonl` beside the trace (this project's trainer's, "
    "every 10 s: about 320 MB), over the same trace without it",
    "inprocess_restart_gap_ratio": "a two-rank job's restart gap after an exception on rank 0 "
    "(the failed incarnation's last span to the next one's first, as `report --json` gives it "
    "on the job rank) under `--inprocess-restart`, over the same job relaunched at once with "
    "`--load` after the same fault",
    "inprocess_back_to_training_ratio": "the same, the restart gap and the next incarnation's "
    "startup together: from the fault back to training",
}

#: The unit of each key that is not a ratio of ours over a baseline.
UNITS = {
    "sigterm_exit_s": "s",
    "report_s_per_million_spans": "s per million spans",
    "report_peak_mb_1m_spans": "MB",
    "check_peak_mb_1m_spans": "MB",
    "cluster_bytes_per_piece": "bytes per iteration",
    "report_long_history_peak_mb": "MB",
}


def unit(key: str) -> str:
    """The unit of ``key``'s figure: ``ratio`` unless ``UNITS`` names another."""
    return UNITS.get(key, "ratio")
