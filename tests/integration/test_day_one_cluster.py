"""Issue 29 on the real API server: the webhook refuses GPU-visibility env and a literal API key, warns about a
missing optional API; the operator applies spec.pod, the API key Secret reference, the owned cache claim, the
engine PodDisruptionBudget and the rollout strategy, and the API server (its pod admission plugins included:
ServiceAccount, RuntimeClass, Priority) accepts the pods they make; status.url names the endpoint."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator.render import lws
from operator_harness import gms, running_webhook_operator, wait_for
from test_admission_webhook import create_until_webhook_answers


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-dayone")) as proc:
        yield proc


def test_gpu_visibility_env_refused_naming_the_opt_in(op, k, ns):
    obj = gms("allgpus", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    outcome, err = create_until_webhook_answers(k, ns, obj)
    assert outcome == "denied" and err.status == 403
    message = json.loads(err.body)["message"]
    assert "spec.env[0] 'NVIDIA_VISIBLE_DEVICES'" in message and "operator.allowUnsafe" in message
    assert "gpu-visibility-env" in message
    with pytest.raises(ApiException) as ei:
        k.get(ns, "allgpus")
    assert ei.value.status == 404  # nothing half-applied


def test_literal_api_key_refused(op, k, ns):
    outcome, err = create_until_webhook_answers(k, ns, gms("literal-key", extraArgs=["--api-key", "sk-live-123"]))
    assert outcome == "denied"
    message = json.loads(err.body)["message"]
    assert "set spec.apiKeySecret" in message and "sk-live-123" not in message


def test_missing_leader_worker_set_api_is_a_warning_naming_what_to_install(op, k, ns, kube_api):
    create_until_webhook_answers(k, ns, gms("probe-webhook"))  # the webhook answers from here on
    ext = kubernetes.client.ApiextensionsV1Api(kube_api)
    try:
        ext.read_custom_resource_definition(lws.CRD)
        installed = True
    except ApiException as e:
        assert e.status == 404
        installed = False
    obj = gms("two-nodes", tensorParallelSize=2, nodes=2)
    r = k.co.create_namespaced_custom_object(
        "serving.gdn-operator.io", "v1alpha1", ns, "gdnmodelservers", obj, _preload_content=False
    )
    warnings = " ".join(r.headers.getlist("Warning")) if hasattr(r.headers, "getlist") else str(r.headers.get("Warning", ""))
    if installed:  # another test of this session installed LWS: nothing to warn about
        assert "LeaderWorkerSet API" not in warnings
    else:
        assert "not runnable on this cluster yet" in warnings and lws.CRD in warnings and "install" in warnings, warnings
        # the status says the same once the operator reconciled it
        wait_for(
            lambda: (k.condition(ns, "two-nodes", "Validated") or {}).get("status") == "False",
            60,
            what="Validated=False for the missing API",
        )
        assert lws.CRD in k.condition(ns, "two-nodes", "Validated")["message"]


def test_pod_settings_cache_claim_budget_and_url_applied(op, k, ns, kube_api):
    core = kubernetes.client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "vllm-reader"}})
    node = kubernetes.client.NodeV1Api(kube_api)
    sched = kubernetes.client.SchedulingV1Api(kube_api)
    for create, body in (
        (node.create_runtime_class, {"metadata": {"name": "nvidia-dayone"}, "handler": "nvidia"}),
        (sched.create_priority_class, {"metadata": {"name": "inference-dayone"}, "value": 1000}),
    ):
        try:
            create(body)
        except ApiException as e:
            if e.status != 409:
                raise
    pod = {
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "vllm-reader",
        "runtimeClassName": "nvidia-dayone",
        "priorityClassName": "inference-dayone",
        "labels": {"kueue.x-k8s.io/queue-name": "gpu"},
        "annotations": {"example.com/team": "ml"},
        "volumes": [{"name": "media", "emptyDir": {}}],
        "volumeMounts": [{"name": "media", "mountPath": "/media"}],
        "securityContext": {"fsGroup": 1000},
        "containerSecurityContext": {"allowPrivilegeEscalation": False},
    }
    obj = gms(
        "dayone",
        pod=pod,
        apiKeySecret={"name": "vllm-key", "key": "key"},
        rollout={"strategy": "InPlace"},
        model={"cache": {"persistentVolumeClaim": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}},
        env=[{"name": "S3_REGION", "configMapKeyRef": {"name": "storage", "key": "region"}}],
    )
    outcome, created = create_until_webhook_answers(k, ns, obj)
    assert outcome == "created", created

    dep = wait_for(lambda: _get(k.apps.read_namespaced_deployment, "dayone", ns), 60, what="engine Deployment")
    assert dep.spec.strategy.rolling_update.max_surge == 0 and dep.spec.strategy.rolling_update.max_unavailable == 1
    ps = dep.spec.template.spec
    assert (ps.service_account_name, ps.runtime_class_name, ps.priority_class_name) == (
        "vllm-reader",
        "nvidia-dayone",
        "inference-dayone",
    )
    assert ps.init_containers[0].name == "model-download"
    env = {e.name: e for e in ps.containers[0].env}
    assert env["VLLM_API_KEY"].value_from.secret_key_ref.name == "vllm-key" and env["VLLM_API_KEY"].value is None
    assert env["HF_HUB_OFFLINE"].value == "1"
    assert {v.name: v for v in ps.volumes}["cache"].persistent_volume_claim.claim_name == "dayone-model-cache"

    pvc = wait_for(lambda: _get(core.read_namespaced_persistent_volume_claim, "dayone-model-cache", ns), 30, what="cache claim")
    assert pvc.spec.access_modes == ["ReadWriteOnce"] and pvc.spec.resources.requests["storage"] == "1Gi"
    assert not pvc.metadata.owner_references  # retainPolicy Retain (default): outlives the server (issue 38)
    pdb = _get(kubernetes.client.PolicyV1Api(kube_api).read_namespaced_pod_disruption_budget, "dayone", ns)
    assert pdb is not None and pdb.spec.max_unavailable == 1  # one at a time, never a drain blocked forever (issue 38)
    assert pdb.spec.selector.match_labels == dep.spec.selector.match_labels

    # the API server's pod admission (ServiceAccount, RuntimeClass, Priority) accepts the pod the settings make
    pods = wait_for(
        lambda: core.list_namespaced_pod(ns, label_selector="serving.gdn-operator.io/server=dayone").items,
        60,
        what="engine pod created",
    )
    assert pods[0].spec.priority == 1000 and pods[0].metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu"
    assert pods[0].metadata.annotations["example.com/team"] == "ml"

    url = wait_for(lambda: k.status(ns, "dayone").get("url"), 60, what="status.url")
    assert url == f"http://dayone.{ns}.svc:8000/v1"
    assert "vllm-key" not in json.dumps(k.status(ns, "dayone"))  # no key material or reference in status

    # dropping the budget deletes the owned PodDisruptionBudget
    k.patch(ns, "dayone", {"spec": {"disruptionBudget": {"enabled": False}}})
    wait_for(
        lambda: _get(kubernetes.client.PolicyV1Api(kube_api).read_namespaced_pod_disruption_budget, "dayone", ns) is None,
        60,
        what="PodDisruptionBudget pruned",
    )


def _get(read, name, ns):
    try:
        return read(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_helm_test_hook_passes_only_while_the_webhook_refuses(op, k, ns, full_cluster, tmp_path):
    """The chart's `helm test` pod script (templates/tests/), run here as a process with the cluster's
    credentials instead of in-cluster ones: against the serving webhook it passes, having seen the 403 that
    names NVIDIA_VISIBLE_DEVICES (its dry-run stores nothing)."""
    import subprocess
    import sys as _sys
    from pathlib import Path

    sys_path = str(Path(__file__).resolve().parents[1] / "charts")
    _sys.path.insert(0, sys_path)
    from _chart_helpers import docs, render_text

    pods = [d for d in docs(render_text()) if d["kind"] == "Pod" and "test" in d["metadata"]["annotations"]["helm.sh/hook"]]
    [pod] = pods
    script = pod["spec"]["containers"][0]["args"][0]
    shim = (
        "import kubernetes, os; kubernetes.config.load_incluster_config = "
        "lambda: kubernetes.config.load_kube_config(os.environ['KUBECONFIG'])\n"
    )
    env = {**full_cluster.env(), "KUBECONFIG": str(full_cluster.kubeconfig), "TEST_NAMESPACE": ns}
    create_until_webhook_answers(k, ns, gms("warm-up"))  # the webhook answers from here on
    run = subprocess.run([_sys.executable, "-c", shim + script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "ok: the webhook refused" in run.stdout, run.stdout + run.stderr
    assert "NVIDIA_VISIBLE_DEVICES" in run.stdout
    with pytest.raises(ApiException) as ei:
        k.get(ns, "helm-test-all-gpus")
    assert ei.value.status == 404
