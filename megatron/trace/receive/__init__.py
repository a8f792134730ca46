"""``megatron-trace receive``: an OTLP receiver that writes the files ``report`` reads.

Megatron-LM's telemetry (nemo-lens) exports over OTLP only, to a collector.
This package stands where the collector's OTLP receiver would: it serves
OTLP/gRPC (:mod:`.grpc_server`, the collector's default port 4317) and
OTLP/HTTP with protobuf or JSON bodies on ``/v1/traces``, ``/v1/metrics`` and
``/v1/logs`` (:mod:`.http_server`, 4318), decodes each export request with
the OTLP protos (:mod:`.convert`), and appends it, split by the process that
sent it, to a folder per job and in it one per rank (:mod:`.files` says how
the job is told from the resource)::

    OUT/JOB/rank0/traces.jsonl   OUT/JOB/rank0/metrics.jsonl   OUT/JOB/rank0/logs.jsonl
    OUT/JOB/rank1/traces.jsonl   ...   OUT/OTHER-JOB/rank0/traces.jsonl   ...

in the OTLP file exporter's JSON format (one export request per line, ids as
hex), so ``megatron-trace report OUT/JOB`` (each rank's ``metrics.jsonl``
beside its trace, as the reader expects) reads what a job exported as if it
had written the files itself.

The optional packages (grpcio, opentelemetry-proto, protobuf: the ``receive``
extra) are imported when a server starts, never at import.
"""

from megatron.trace.receive.files import (
    DEFAULT_MAX_FOLDERS,
    FolderLimitError,
    RankFiles,
    job_folder,
    job_id,
    rank_folder,
)
from megatron.trace.receive.server import Receiver

__all__ = [
    "DEFAULT_MAX_FOLDERS",
    "FolderLimitError",
    "RankFiles",
    "Receiver",
    "job_folder",
    "job_id",
    "rank_folder",
]
