"""The gdn-guard guard fa3-group-metadata (G1, issue 33): its decision, its refusal paths, real vLLM builders, and
the wheels' source it is ranged from.

* decide(): which builders may no longer hand their metadata to another KV-cache group (FULL graphs only).
* engine (marker ``engine``, the vLLM 0.32.0 CPU venv): vLLM's own plugin loader applies the guard, and REAL
  FlashAttentionMetadataBuilder objects built with FULL CUDA graphs stop reusing metadata across groups, while
  PIECEWISE / eager builders, and every builder without the plugin, keep vLLM's reuse.
* the wheels' source: every vLLM wheel in the cache still has the reuse the guard turns off, the FULL-graph flag
  it reads, and the runner's per-group capture (the guard's range: no release fixes it).
"""

from __future__ import annotations

import ast
import json
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from images_env import CACHE, ENGINE_DIR, REPO, engine_env

from gdn_guard.guards import GuardUnavailable, fa3_group_metadata

TINY = REPO / "tests" / "models" / "tiny-qwen3-next-recall"


@pytest.mark.parametrize(
    "builder, change",
    [
        (SimpleNamespace(supports_update_block_table=True, use_full_cuda_graph=True), True),
        (SimpleNamespace(supports_update_block_table=True, use_full_cuda_graph=False), False),
        (SimpleNamespace(supports_update_block_table=True), True),  # flag unreadable: building per group is safe
        (SimpleNamespace(supports_update_block_table=False, use_full_cuda_graph=True), False),
    ],
)
def test_decide(builder, change):
    got, why = fa3_group_metadata.decide(builder)
    assert got is change and why


def test_apply_refuses_without_vllm():
    with pytest.raises(GuardUnavailable, match="cannot import vllm.v1.attention.backends.flash_attn"):
        fa3_group_metadata.apply()
    assert fa3_group_metadata.is_applied() is False


# ------------------------------------------------------------------------------ real vLLM 0.32.0 --


def _probe(engine_python: Path, *paths: Path, **env: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "fa3_builder_probe.py"), str(TINY)],
        capture_output=True,
        text=True,
        timeout=600,
        env=engine_env(*paths, **env),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"probe exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stdout + proc.stderr


@pytest.mark.engine
def test_real_builders_stop_reusing_metadata_under_full_graphs_0320(engine_python, gdn_guard_site):
    got, log = _probe(engine_python, gdn_guard_site)
    assert got["init_wrapped"] is True and got["class_reuse"] is True  # the class default is left alone
    assert got["FULL_AND_PIECEWISE"] == {"reuse": False, "full": True}
    assert got["FULL_DECODE_ONLY"] == {"reuse": False, "full": True}
    assert got["PIECEWISE"] == {"reuse": True, "full": False}
    assert got["NONE"] == {"reuse": True, "full": False}
    assert "active guards: [fa3-group-metadata], patch ids: [gdn-guard/fa3-group-metadata]" in log
    assert log.count("gdn-guard fa3-group-metadata (G1): FULL CUDA graphs") == 1  # one decision line per process


@pytest.mark.engine
def test_real_builders_without_the_guard_keep_the_reuse_0320(engine_python, gdn_guard_site):
    got, log = _probe(engine_python, gdn_guard_site, GDN_GUARD_DISABLE="fa3-group-metadata")
    assert got["init_wrapped"] is False
    assert got["FULL_AND_PIECEWISE"] == {"reuse": True, "full": True}  # vLLM as shipped: G1's trigger
    assert "gdn-guard fa3-group-metadata (G1)" not in log


# ------------------------------------------------------------------------------- the wheels' source --


def _wheels() -> list[Path]:
    return sorted({*CACHE.glob("gpu-wheels/vllm-*.whl"), *CACHE.glob("wheels/vllm-*/vllm-*.whl")})


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


@pytest.mark.engine
@pytest.mark.parametrize("wheel", _wheels(), ids=lambda w: w.name.split("-")[1])
def test_wheel_source_has_the_reuse_the_guard_turns_off(wheel):
    """FlashAttentionMetadataBuilder: class-level `supports_update_block_table: bool = True`, an
    update_block_table that shallow-copies, `self.use_full_cuda_graph` set in __init__; the V1 runner builds each
    group at capture (build_for_cudagraph_capture) and reuses metadata at run time only when the flag is on."""
    with zipfile.ZipFile(wheel) as z:
        fa = z.read("vllm/v1/attention/backends/flash_attn.py").decode()
        if "vllm/v1/worker/gpu_model_runner.py" not in z.namelist():
            # vLLM 0.34.0 removed the V1 runner (G1's rule ends at 0.33.x): the V2 runner hands one group's metadata to
            # another only for Mamba groups (vllm/v1/worker/gpu/attn_utils.py), so FlashAttention groups are built
            # each and the guard has nothing to turn off
            v2 = z.read("vllm/v1/worker/gpu/attn_utils.py").decode()
            assert "reuse_key = None" in v2 and "supports_update_block_table and isinstance(" in v2
            assert v2.index("attn_group.kv_cache_spec, MambaSpec", v2.index("reuse_key = None")) > 0
            return
        runner = z.read("vllm/v1/worker/gpu_model_runner.py").decode()
        # the per-group capture moved from the runner into vllm/v1/worker/utils.py by 0.33.0
        worker = {n: z.read(n).decode() for n in z.namelist() if n.startswith("vllm/v1/worker/") and n.endswith(".py")}
    cls = _class(ast.parse(fa), fa3_group_metadata.CLASS)
    flags = [
        n for n in cls.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "supports_update_block_table"
    ]
    assert flags and isinstance(flags[0].value, ast.Constant) and flags[0].value.value is True
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "update_block_table" in methods and "copy.copy(metadata)" in ast.get_source_segment(fa, methods["update_block_table"])
    assert "self.use_full_cuda_graph = " in ast.get_source_segment(fa, methods["__init__"])
    assert any(".build_for_cudagraph_capture(" in src for src in worker.values())
    reuse = runner.index("and builder.supports_update_block_table")
    assert runner.index("builder.update_block_table(", reuse) > reuse


def test_wheels_are_found_for_the_source_check():
    """The source check above needs at least the GPU bundle's vLLM wheel (hack/gpu/bundle.sh caches it)."""
    if not _wheels():
        pytest.skip(f"no vLLM wheel under {CACHE}/gpu-wheels or {CACHE}/wheels (hack/gpu/bundle.sh downloads one)")
    assert all(w.name.startswith("vllm-") for w in _wheels())
