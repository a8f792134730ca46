"""Install nemo-lens (with its ``sdk`` extra) from ``NEMO_LENS_DIR`` into this environment.

``tox -e upstream`` runs this before its tests. The source tree is copied
first, so a read-only checkout (``../shared/upstream/nemo-lens`` in CI) is
never written to by the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    value = os.environ.get("NEMO_LENS_DIR", "").strip()
    source = Path(value).resolve() if value else None
    if source is None or not (source / "pyproject.toml").is_file():
        print(
            f"NEMO_LENS_DIR={value!r}: not a nemo-lens checkout (no pyproject.toml there); "
            "e.g. NEMO_LENS_DIR=../shared/upstream/nemo-lens",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "nemo-lens"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.egg-info", "build"))
        for root, dirs, files in os.walk(copy):
            for name in dirs + files:
                path = Path(root, name)
                path.chmod(path.stat().st_mode | 0o200)
        command = [sys.executable, "-m", "pip", "install", "-q", f"{copy}[sdk]"]
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
