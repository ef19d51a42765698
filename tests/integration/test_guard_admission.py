"""GDNGuard admission through the real API server (issue 35): a Deployment whose pod template launches vLLM
with a known-crash line (vllm#36917: vLLM 0.17.1 + MTP on a Qwen3.5 model, GDN attention AssertionError) is
admitted with a warning under policy warn and refused under policy deny; a clean line is admitted without a
warning; a Deployment outside every guard never reaches the webhook (the API server's own webhook request
counter stays flat); and nothing the webhook saw carries a gdn-operator field manager (it never writes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, GUARD_PLURAL, VERSION
from gdn_operator.api.crd import guard_crd_manifest
from gdn_operator.handlers.guard.admission import GUARD_WEBHOOK_ID, guard_config_name
from builders import CLEAN_ARGS, Guard, Workload
from operator_harness import WEBHOOK_CONFIG, install_crd, running_webhook_operator, wait_for

GUARDS_CONFIG = guard_config_name(WEBHOOK_CONFIG)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "guard" / "my-vllm.yaml"
#: admission judges the template: no pods needed
NO_PODS = Workload().replicas(0)


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    install_crd(kube_api)  # (its wait reads GDNModelServers)
    install_crd(kube_api, guard_crd_manifest())
    co = kubernetes.client.CustomObjectsApi(kube_api)
    wait_for(lambda: co.list_cluster_custom_object(GROUP, VERSION, GUARD_PLURAL) is not None, 30, what="GDNGuard CRD served")
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    try:
        with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-guard")) as proc:
            yield proc
    finally:
        try:
            adm.delete_validating_webhook_configuration(GUARDS_CONFIG)
        except ApiException as e:
            if e.status != 404:
                raise


def webhook_calls(api) -> float:
    """The API server's count of calls to the guard webhooks (apiserver_admission_webhook_request_total)."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    resp = api.rest_client.pool_manager.request(method, url, headers=headers, timeout=30)
    assert resp.status == 200, resp.data[:300]
    total = 0.0
    for line in resp.data.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_request_total{") and f".{GUARD_WEBHOOK_ID}." in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def create_guard(kube_api, ns, body):
    co = kubernetes.client.CustomObjectsApi(kube_api)
    co.create_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, body)
    create_guard_wait(kube_api, ns, body["spec"]["selector"]["matchLabels"])


def create_guard_wait(kube_api, ns, match_labels):
    """Until the guard webhook configuration has the guard's webhook (scoped to `ns` and its labels)."""
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)

    def scoped():
        cfg = adm.read_validating_webhook_configuration(GUARDS_CONFIG)
        return any(
            any(e.operator == "In" and e.values == [ns] for e in h.namespace_selector.match_expressions or [])
            and all(
                f"object.metadata.labels['{k}'] == '{v}'" in (h.match_conditions or [])[0].expression
                for k, v in match_labels.items()
            )
            for h in cfg.webhooks or []
        )

    def present():
        try:
            return scoped()
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    wait_for(present, 60, what="guard webhook scoped to the guard")


def create_deployment(kube_api, ns, obj):
    """Create through the webhook; a fresh webhook may need a moment before the API server calls it."""
    apps = kubernetes.client.AppsV1Api(kube_api)

    def attempt():
        try:
            resp = apps.create_namespaced_deployment(ns, obj, _preload_content=False)
            warnings = [v for k, v in resp.getheaders().items() if k.lower() == "warning"]
            return ("created", warnings)
        except ApiException as e:
            if e.status == 500 and "failed calling webhook" in (e.body or ""):
                return None
            return ("denied", e)

    return wait_for(attempt, 30, interval=0.5, what="webhook answer")


def managers(kube_api, ns, name):
    apps = kubernetes.client.AppsV1Api(kube_api)
    return {m.manager for m in apps.read_namespaced_deployment(name, ns).metadata.managed_fields or []}


def test_known_crash_warned_then_refused_clean_admitted_unguarded_never_called(op, kube_api, ns):
    create_guard(kube_api, ns, Guard("warn-guard", None).select({"app": "crashy"}).policy("warn").obj())

    # warn: admitted, with the same rule line gdnctl validate prints, led by the guard's name
    before = webhook_calls(kube_api)
    outcome, warnings = create_deployment(kube_api, ns, NO_PODS.name("crashy").labelled({"app": "crashy"}).tag("v0.17.1").obj())
    assert outcome == "created", warnings
    text = " ".join(warnings)
    assert "vllm#36917" in text and f"GDNGuard {ns}/warn-guard" in text, warnings
    assert webhook_calls(kube_api) > before  # the positive control for the flat counter below
    assert "gdn-operator" not in managers(kube_api, ns, "crashy")  # validating only: nothing written

    # clean: admitted without a warning
    create_guard(kube_api, ns, Guard("clean-guard", None).select({"app": "clean"}).policy("deny").obj())
    outcome, warnings = create_deployment(
        kube_api, ns, NO_PODS.name("clean").labelled({"app": "clean"}).tag("v0.33.0").args(*CLEAN_ARGS).obj()
    )
    assert (outcome, warnings) == ("created", [])
    assert "gdn-operator" not in managers(kube_api, ns, "clean")

    # deny: the same launch line refused, nothing created
    create_guard(kube_api, ns, Guard("deny-guard", None).select({"app": "refused"}).policy("deny").obj())
    outcome, err = create_deployment(kube_api, ns, NO_PODS.name("refused").labelled({"app": "refused"}).tag("v0.17.1").obj())
    assert outcome == "denied" and err.status == 403, err
    message = json.loads(err.body)["message"]
    assert f"refused by GDNGuard {ns}/deny-guard (admission policy deny)" in message and "vllm#36917" in message
    with pytest.raises(ApiException) as ei:
        kubernetes.client.AppsV1Api(kube_api).read_namespaced_deployment("refused", ns)
    assert ei.value.status == 404

    # outside every guard: the same known-crash line, never sent to the webhook
    calls = webhook_calls(kube_api)
    outcome, warnings = create_deployment(
        kube_api, ns, NO_PODS.name("unguarded").labelled({"app": "unguarded"}).tag("v0.17.1").obj()
    )
    assert (outcome, warnings) == ("created", [])
    assert webhook_calls(kube_api) == calls
    assert re.search(r"guard admission (admitted|denied) Deployment " + re.escape(f"{ns}/unguarded"), op.log_tail(400)) is None


def test_deleting_the_guard_removes_its_webhook(op, kube_api, ns):
    create_guard(kube_api, ns, Guard("gone", None).select({"app": "gone"}).policy("deny").obj())
    co = kubernetes.client.CustomObjectsApi(kube_api)
    co.delete_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, "gone")
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)

    def unscoped():
        cfg = adm.read_validating_webhook_configuration(GUARDS_CONFIG)
        return not any(
            any(e.operator == "In" and e.values == [ns] for e in h.namespace_selector.match_expressions or [])
            for h in cfg.webhooks or []
        )

    wait_for(unscoped, 60, what="guard webhook removed")
    outcome, warnings = create_deployment(kube_api, ns, NO_PODS.name("gone").labelled({"app": "gone"}).tag("v0.17.1").obj())
    assert (outcome, warnings) == ("created", [])


@pytest.mark.tools
@pytest.mark.readme("kubectl apply -n NAMESPACE -f examples/guard/my-vllm.yaml")
def test_the_readme_guard_warns_on_a_known_crash_deployment(op, kube_api, full_cluster, ns):
    """README "Guard an existing vLLM deployment": the example guard, applied with kubectl as written there,
    warns on a Deployment labelled app=my-vllm whose launch line a known-crash rule matches."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
    from _chart_helpers import tools

    res = subprocess.run(
        [tools()["kubectl"], "--kubeconfig", str(full_cluster.kubeconfig), "apply", "-n", ns, "-f", str(EXAMPLE)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    create_guard_wait(kube_api, ns, {"app": "my-vllm"})
    outcome, warnings = create_deployment(kube_api, ns, NO_PODS.name("my-vllm").labelled({"app": "my-vllm"}).tag("v0.17.1").obj())
    assert outcome == "created" and any("vllm#36917" in w and f"GDNGuard {ns}/my-vllm" in w for w in warnings), warnings
    assert "gdn-operator" not in managers(kube_api, ns, "my-vllm")
