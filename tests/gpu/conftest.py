"""GPU tier (pytest marker ``gpu``): real vLLM 0.22.0 on an NVIDIA GPU, from the offline bundle.

Never part of CI or ``hack/test.sh``: every test here is deselected unless ``GDN_GPU_TEST=1``, which
``hack/gpu-test.sh`` sets on the GPU host together with GDN_GPU_SITE (the installed bundle) and
GDN_GPU_ARTIFACTS (where engine logs and /metrics captures are copied, flat, at most 6 files).

All engines start at once, at the beginning of the session (``engines``), with a small GPU share each,
so that one cold start (~4 min, Triton JIT) is paid once and overlaps the CPU-only tests (CLI parser,
V2-runner refusal) that run first.  Configurations (all rendered by ``gdnctl render``):

  rendered     the adapted example as the operator admits it at 0.22.0 (MTP k=2; async scheduling
               turned off by the vllm#45100 mitigation), with the gdn-guard plugin
  mtp-async    MTP k=2, async scheduling on (vLLM's default): the rendered line of `rendered` with
               --no-async-scheduling flipped, since the operator enforces vllm#45100 at 0.22.0
  nomtp-async  speculative decoding off, async scheduling on
  nomtp-sync   speculative decoding off, async scheduling off
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

sys.path.insert(0, str(harness.OPERATOR_SRC))

CONFIGS, GUARDED = harness.CONFIGS, harness.GUARDED


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and the offline vLLM bundle (hack/gpu-test.sh)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    mine = [i for i in items if here in Path(str(i.fspath)).resolve().parents]
    for i in mine:
        i.add_marker(pytest.mark.gpu)
    if os.environ.get("GDN_GPU_TEST") != "1" and mine:
        config.hook.pytest_deselected(items=mine)
        keep = set(map(id, mine))
        items[:] = [i for i in items if id(i) not in keep]


@pytest.fixture(scope="session")
def gpu_site() -> str:
    site = os.environ.get("GDN_GPU_SITE")
    if not site or not Path(site, "vllm").is_dir():
        pytest.fail(f"GDN_GPU_SITE={site!r} does not hold the installed bundle (run hack/gpu/install.sh)", pytrace=False)
    return site


@pytest.fixture(scope="session")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="gdn-gpu-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    d = Path(os.environ.get("GDN_GPU_ARTIFACTS") or tempfile.mkdtemp(prefix="gdn-gpu-artifacts-"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def guard_dir(workdir) -> Path:
    """images/gdn-guard installed (entry point vllm.general_plugins) into its own dir, as the image does
    with pip; if the host cannot build it (no setuptools >= 77), the same layout is written directly:
    the package plus a dist-info with the entry points from its pyproject.toml."""
    src = workdir / "gdn-guard-src"
    shutil.copytree(harness.REPO / "images" / "gdn-guard", src)
    dest = workdir / "gdn-guard"
    p = subprocess.run(
        [
            harness.PYTHON,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(dest),
            str(src),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=""),
    )
    if p.returncode == 0:
        return dest
    print(f"gdn-guard: pip could not build it here ({p.stderr.strip().splitlines()[-1:]}); writing the layout directly")
    return harness.install_guard_layout(dest)


@pytest.fixture(scope="session")
def results(artifacts):
    """Figures the tests record; written to artifacts/gpu-results.json at the end of the session."""
    import json

    data: dict = {"vllm_version": harness.VLLM_VERSION}
    yield data
    (artifacts / "gpu-results.json").write_text(json.dumps(data, indent=1) + "\n")


@pytest.fixture(scope="session")
def engines(gpu_site, workdir, guard_dir, artifacts):
    """Start every configuration now; tests call ``ready(engines, name)``. Logs go to artifacts at the end."""
    model = harness.model_dir()
    if not (model / "config.json").is_file() or not (model / "heldout.jsonl").is_file():
        pytest.fail(
            f"{model}: the trained tiny model (config.json, model.safetensors, heldout.jsonl) is missing; "
            "set GDN_GPU_MODEL or merge branch model",
            pytrace=False,
        )
    started: dict[str, harness.Engine] = {}
    try:
        for name, kw in CONFIGS.items():
            r = harness.config_rendered(**kw)
            extra = [str(guard_dir)] if name == GUARDED else []
            started[name] = harness.start(name, r, workdir / "engines", site_path=gpu_site, extra_pythonpath=extra)
            started[name].extra["rendered"] = r
        yield started
    finally:
        for eng in started.values():
            harness.stop(eng)
        for eng in started.values():
            if eng.name in ("rendered", "mtp-async") and eng.log.exists():
                shutil.copyfile(eng.log, artifacts / eng.log.name)
