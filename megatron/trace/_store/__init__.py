"""Private: how a read keeps what it holds in flat memory.

Out-of-core iteration columns, the structural record log, span-id sets,
exact order statistics by selection, stretches of time, JSON columns, and the
one spill file they all write to. Nothing outside ``megatron.trace`` imports
these modules; their shapes may change with any release.
"""
