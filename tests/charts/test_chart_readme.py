"""The README's helm lines, as written, against a fresh real API server (issue 27): `helm install
gdn-operator charts/gdn-operator` into the kubeconfig's default namespace, then `helm upgrade`.

A control plane of its own: the session's clusters hold the CRD already (applied by other tests, without
helm's ownership labels), which a first install on a user's clean cluster never meets.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from kubernetes import client

from _chart_helpers import ROOT
from controlplane import ControlPlane, ControlPlaneError, ensure_built
from readme_commands import key, readme_commands

pytestmark = [pytest.mark.cluster, pytest.mark.tools]


def _run(raw: str, kubeconfig, helm_dir: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PATH=f"{helm_dir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", raw], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(600)
@pytest.mark.readme("helm install gdn-operator charts/gdn-operator")
@pytest.mark.readme("helm upgrade")
def test_readme_helm_install_and_upgrade_on_a_clean_cluster(chart_tools, tmp_path):
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1: real control-plane tests disabled")
    install = readme_commands()[key("helm install gdn-operator charts/gdn-operator")]
    helm_dir = os.path.dirname(chart_tools["helm"])
    try:
        cp = ControlPlane(tmp_path / "cp", tier="core", binaries=ensure_built("core")).start()
    except ControlPlaneError as e:
        pytest.fail(f"starting the core control plane failed: {e}", pytrace=False)
    try:
        res = _run(install, cp.kubeconfig, helm_dir)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "STATUS: deployed" in res.stdout, res.stdout
        with cp.api_client() as api:
            dep = client.AppsV1Api(api).read_namespaced_deployment("gdn-operator", "default")
            assert dep.spec.template.spec.service_account_name == "gdn-operator"
            client.ApiextensionsV1Api(api).read_custom_resource_definition("gdnmodelservers.serving.gdn-operator.io")
            names = [
                w.metadata.name for w in client.AdmissionregistrationV1Api(api).list_validating_webhook_configuration().items
            ]
            assert any("gdn-operator" in n for n in names), names
        res = _run("helm upgrade gdn-operator charts/gdn-operator", cp.kubeconfig, helm_dir)
        assert res.returncode == 0 and "has been upgraded" in res.stdout, res.stdout + res.stderr
        res = _run("helm status gdn-operator", cp.kubeconfig, helm_dir)
        assert "REVISION: 2" in res.stdout and "STATUS: deployed" in res.stdout, res.stdout
    finally:
        cp.stop()
