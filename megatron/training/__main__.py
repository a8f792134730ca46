"""``python -m megatron.training`` and the ``megatron-pretrain`` console script.

The first statement takes ``program_start``, before torch and everything else
is imported: the startup trace shows that import time as
``megatron.startup.imports`` (``[program_start, main_entry]``), and on a cold
cluster node it is often the largest piece of startup.

Errors a user can fix (bad telemetry settings found at setup, an unreadable
checkpoint) end as one ``megatron-pretrain: error: ...`` line and exit status
2, like the argument errors argparse reports; everything else keeps its
traceback.
"""

import time

PROGRAM_START = time.time()

import sys  # noqa: E402

from megatron.core.telemetry import TelemetryConfigError  # noqa: E402
from megatron.training.arguments import PROG, parse_args  # noqa: E402
from megatron.training.checkpointing import CheckpointError  # noqa: E402
from megatron.training.training import pretrain  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    main_entry = time.time()
    args = parse_args(argv)
    try:
        pretrain(args, program_start=PROGRAM_START, main_entry=main_entry)
    except (CheckpointError, TelemetryConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if args.demo:  # the demo ends by drawing its trace; never raises
        from megatron.trace.timeline import write_beside_trace

        write_beside_trace(args)


if __name__ == "__main__":
    main()
