"""The set-up scripts of the README's tier table, run as the README shows them: each one is idempotent and,
with its tier in place (hack/test.sh sets the Go and engine tiers up before these tests; bootstrap and tools
are run twice here), only checks its cache and says so — nothing is rebuilt or downloaded again (issue 27)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> str:
    res = subprocess.run(["bash", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout.rstrip("\n") + "\n" + res.stderr


@pytest.mark.readme("hack/bootstrap.sh")
def test_bootstrap_is_idempotent():
    _run("hack/bootstrap.sh")  # hack/test.sh ran it first; a plain pytest run may have a changed pyproject.toml
    out = _run("hack/bootstrap.sh")
    assert "creating" not in out and "installing" not in out, out  # the second run: the stamp matches


@pytest.mark.cluster
@pytest.mark.fullcluster
@pytest.mark.readme("tests/cluster/build.sh full")
def test_build_sh_full_is_cached():
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1")
    out = _run("tests/cluster/build.sh", "full")
    for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        assert any(component in ln and "cached" in ln for ln in out.splitlines()), f"{component}:\n{out}"
    assert "built in" not in out, out


@pytest.mark.monitoring
@pytest.mark.readme("tests/cluster/build.sh monitoring")
def test_build_sh_monitoring_is_cached():
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1")
    out = _run("tests/cluster/build.sh", "monitoring")
    for component in ("prometheus-operator", "prometheus v"):
        assert any(component in ln and "cached" in ln for ln in out.splitlines()), f"{component}:\n{out}"
    assert "built in" not in out, out


@pytest.mark.tools
@pytest.mark.readme("hack/tools.sh")
def test_tools_sh_is_idempotent():
    _run("hack/tools.sh")  # installs on a fresh machine (the unit tier does not set tools up)
    out = _run("hack/tools.sh")
    assert "present" in out and "downloading" not in out, out
    kv = dict(ln.split("=", 1) for ln in out.splitlines() if re.match(r"[A-Z]+=/", ln))
    assert {"HELM", "KUBECTL", "PROMTOOL"} <= set(kv) and all(Path(v).is_file() for v in kv.values()), kv


@pytest.mark.engine
@pytest.mark.readme("hack/vllm-cpu-env.sh")
def test_vllm_cpu_env_is_cached():
    if os.environ.get("GDN_SKIP_ENGINE") == "1":
        pytest.skip("GDN_SKIP_ENGINE=1")
    out = _run("hack/vllm-cpu-env.sh")
    assert "vllm-cpu env ready" in out and "==>" not in out, out  # no install step ran
    py = next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("python: "))
    assert Path(py).is_file()
