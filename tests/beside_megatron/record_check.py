"""Which files of an installed distribution are no longer as its ``RECORD`` says.

Run by the interpreter whose installation is checked (the tox env's, or a
throwaway venv's): ``python record_check.py DISTRIBUTION``. Prints a JSON
object: ``files``, how many the ``RECORD`` lists, and ``damaged``, each file
that is missing or whose sha256 differs from the one recorded at install
(the bytecode pip compiled has no hash in ``RECORD``: it only has to exist).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from importlib.metadata import distribution


def damaged(name: str) -> tuple[int, list[str]]:
    dist = distribution(name)
    files = dist.files or []
    found = []
    for file in files:
        path = dist.locate_file(file)
        if not path.is_file():
            found.append(f"{file}: missing")
            continue
        if file.hash is None:
            continue
        digest = hashlib.new(file.hash.mode, path.read_bytes()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != file.hash.value:
            found.append(f"{file}: changed")
    return len(files), found


if __name__ == "__main__":
    count, found = damaged(sys.argv[1])
    print(json.dumps({"files": count, "damaged": found}))
