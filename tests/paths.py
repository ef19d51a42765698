"""Every path the tests use, in one place.

- ``REPO``: the checkout's root.
- ``SHARED``: the shared facts folder, ``$GDN_SHARED_DIR`` or ``<repo>/../shared`` (never an absolute
  machine path).
- ``SHARED_FIXTURES``: ``SHARED/fixtures`` (real CPU and H100 captures).
- ``gdnctl()``: the ``gdnctl`` console script of the interpreter running the tests.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GDN_SHARED_DIR", REPO.parent / "shared"))
SHARED_FIXTURES = SHARED / "fixtures"
CPU_CAPTURES = SHARED_FIXTURES / "vllm-0.32.0-cpu"


def gdnctl() -> str:
    """Path of ``gdnctl`` next to the running interpreter (the project venv), else on PATH."""
    found = shutil.which("gdnctl", path=str(Path(sys.executable).parent)) or shutil.which("gdnctl")
    if found is None:
        raise RuntimeError("gdnctl not found: run hack/bootstrap.sh (installs it into .venv/bin)")
    return found
