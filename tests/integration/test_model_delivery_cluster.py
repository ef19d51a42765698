"""Model delivery on the real control plane (issue 38 item 3): a pod whose model download step keeps failing,
or whose image cannot be pulled, reaches the server's status as StartFailed (ModelDownloadFailed /
ImagePullFailed, with the download step's last words or the kubelet's message), Degraded, and a Warning
Event; it clears once the pod starts. kwok reports the kubelet's side (tests/cluster/kwok/extra.yaml,
gdn-pod-start-failure). The cache claim the operator creates outlives the server (retainPolicy Retain, the
default) or goes with it (Delete), decided by the real garbage collector."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from operator_harness import gms, running_operator, wait_for

GATED = (
    "gdn-operator: hf download Qwen/Qwen3.5-27B --revision main\n"
    "Cannot access gated repo for url https://huggingface.co/api/models/Qwen/Qwen3.5-27B/revision/main. "
    "Access to model Qwen/Qwen3.5-27B is restricted. You must have access to it and be authenticated.\n"
    "gdn-operator: download of Qwen/Qwen3.5-27B failed (see the lines above)"
)
PULL = 'Back-off pulling image "ghcr.io/gdn-operator/vllm-gdn:v0.33.0-gdn9": not found'


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-delivery")) as proc:
        yield proc


def running_pod(k, ns, name):
    def one():
        pods = [p for p in k.engine_pods(ns, name) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return pods[0] if len(pods) == 1 else None

    return wait_for(one, 90, what=f"one running engine pod of {name}")


def report(k, ns, pod, mode, message=""):
    ann = {"gdn-operator.io/test-start-failure": mode, "gdn-operator.io/test-start-failure-message": message}
    k.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": ann}})


def test_download_and_pull_failures_reach_status_and_events(op, k, ns):
    k.create(ns, gms("dl"))
    pod = running_pod(k, ns, "dl").metadata.name

    report(k, ns, pod, "download", GATED)
    cond = k.wait_condition(ns, "dl", "StartFailed", reason="ModelDownloadFailed", timeout=30)
    assert "Cannot access gated repo" in cond["message"] and pod in cond["message"], cond
    assert k.condition(ns, "dl", "Degraded")["reason"] == "ModelDownloadFailed"
    ev = wait_for(lambda: k.events(ns, "dl", "ModelDownloadFailed"), 15, what="ModelDownloadFailed event")
    assert ev[0].type == "Warning" and "gated repo" in ev[0].message

    report(k, ns, pod, "pull", PULL)
    cond = k.wait_condition(ns, "dl", "StartFailed", reason="ImagePullFailed", timeout=30)
    assert "ImagePullBackOff" in cond["message"] and "v0.33.0-gdn9" in cond["message"], cond
    wait_for(lambda: k.events(ns, "dl", "ImagePullFailed"), 15, what="ImagePullFailed event")

    report(k, ns, pod, "none")
    cond = k.wait_condition(ns, "dl", "StartFailed", status="False", reason="Started", timeout=30)
    assert k.condition(ns, "dl", "Degraded")["status"] == "False"


def _claim(k, ns, name):
    try:
        return k.core.read_namespaced_persistent_volume_claim(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _deployment_gone(k, ns, name):
    try:
        k.apps.read_namespaced_deployment(name, ns)
    except ApiException as e:
        return e.status == 404
    return False


@pytest.mark.parametrize(("policy", "kept"), [(None, True), ("Delete", False)])
def test_cache_claim_kept_or_deleted_with_the_server(op, k, ns, policy, kept):
    name = "keep" if kept else "drop"
    claim = {"size": "1Gi", "accessMode": "ReadWriteOnce"} | ({"retainPolicy": policy} if policy else {})
    k.create(ns, gms(name, model={"cache": {"persistentVolumeClaim": claim}}))
    pvc = wait_for(lambda: _claim(k, ns, f"{name}-model-cache"), 60, what="cache claim")
    assert bool(pvc.metadata.owner_references) is not kept
    wait_for(lambda: not _deployment_gone(k, ns, name), 60, what="engine Deployment")
    k.delete(ns, name)
    # the garbage collector has acted on the server's dependents once its Deployment is gone
    wait_for(lambda: _deployment_gone(k, ns, name), 60, what="Deployment collected")
    if kept:
        assert _claim(k, ns, f"{name}-model-cache") is not None  # 800 GB are not downloaded again
        k.create(ns, gms(name, model={"cache": {"persistentVolumeClaim": claim}}))  # re-created: the claim is reused
        dep = wait_for(
            lambda: not _deployment_gone(k, ns, name) and k.apps.read_namespaced_deployment(name, ns), 60, what="Deployment"
        )
        vols = {v.name: v for v in dep.spec.template.spec.volumes}
        assert vols["cache"].persistent_volume_claim.claim_name == f"{name}-model-cache"
        # the reconcile applied the kept claim again (adopted it) and finished
        wait_for(lambda: (k.get(ns, name).get("status") or {}).get("observedGeneration") == 1, 60, what="reconciled")
        assert k.condition(ns, name, "Validated")["status"] == "True"
        assert not _claim(k, ns, f"{name}-model-cache").metadata.owner_references
    else:
        wait_for(
            lambda: (
                _claim(k, ns, f"{name}-model-cache") is None or _claim(k, ns, f"{name}-model-cache").metadata.deletion_timestamp
            ),
            60,
            what="claim deleted",
        )
