"""A folder named where trace files are expected: the trace files it holds.

``megatron-trace receive`` writes ``OUT/JOB/RANK/traces.jsonl``
(:mod:`megatron.trace.receive.files`). Every command that reads trace files
takes, in place of a file, one of these folders:

* a **rank's** folder (it holds ``traces.jsonl``): that file;
* a **job's** folder (``RANK/traces.jsonl`` in it): each rank's file, one job;
* a **receiver's** folder (``JOB/RANK/traces.jsonl``): the files of its one job;
  when it holds several, the command stops with one line naming them and how
  to pick one (a job's folder), since reading them together would merge jobs.

Each rank's ``metrics.jsonl`` is found beside its trace, as for a file named.
Several receivers' folders of one job (``report A/JOB B/JOB``) read as that job.
A file named twice, by two paths or through a link (a shell glob that matches a
folder and a symlink to it), is read once: read twice, every span would count twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from megatron.trace_format.errors import TraceInputError

__all__ = ["TRACE_FILE", "expand", "jobs_in"]

#: The trace file of a rank's folder, as the receiver names it.
TRACE_FILE = "traces.jsonl"


def jobs_in(folder: Path) -> list[Path]:
    """The job folders of a receiver's ``folder`` (those with a ``RANK/traces.jsonl``)."""
    return sorted({path.parent.parent for path in folder.glob(f"*/*/{TRACE_FILE}")})


def _rank_files(job: Path) -> list[Path]:
    return sorted(job.glob(f"*/{TRACE_FILE}"))


def folder_files(folder: Path, command: str) -> list[Path]:
    """The trace files ``folder`` stands for (see the module docstring)."""
    if (folder / TRACE_FILE).is_file():
        return [folder / TRACE_FILE]
    ranks = _rank_files(folder)
    if ranks:
        return ranks
    jobs = jobs_in(folder)
    if len(jobs) == 1:
        return _rank_files(jobs[0])
    if jobs:
        names = ", ".join(job.name for job in jobs[:5]) + (", ..." if len(jobs) > 5 else "")
        raise TraceInputError(
            f"{folder} is a receiver's folder holding {len(jobs)} jobs ({names}): name one "
            f"job's folder, e.g. megatron-trace {command} {jobs[0]}"
        )
    raise TraceInputError(
        f"{folder} is a folder without trace files: expected {TRACE_FILE} in it, in its "
        f"RANK/ folders (a job's, as receive writes them) or in JOB/RANK/ (a receiver's)"
    )


def expand(paths: Sequence[Path], command: str) -> list[Path]:
    """``paths`` with each folder among them replaced by its trace files; files as given,
    each file once (the first path that names it)."""
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for path in paths:
        for file in folder_files(path, command) if path.is_dir() else [path]:
            try:
                info = file.stat()
            except OSError:  # a missing file: the reader names it
                found.append(file)
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                found.append(file)
    return found
