"""``python -m megatron.trace``: the same as the ``megatron-trace`` console script."""

from megatron.trace.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
