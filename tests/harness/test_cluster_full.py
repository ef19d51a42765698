"""Full tier: the scheduler places GPU pods on kwok's fake nodes; kwok stages fake crashes.

Pod IPs are loopback (kwok --cidr 127.N.0.0/16, controlplane.POD_CIDR) so stand-in servers can bind them.
"""

from __future__ import annotations

import ipaddress
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controlplane import (
    CRASH_ANNOTATION,
    CRASH_CONTAINER_ANNOTATION,
    CRASH_EXIT_CODE_ANNOTATION,
    GPU_RESOURCE,
)
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.fullcluster]


@pytest.fixture
def api(full_cluster):
    with full_cluster.api_client() as a:
        yield a


@pytest.fixture
def ns(api):
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(api).delete_namespace(name)


def _deployment(name: str, gpus: int, containers: int = 1) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [
                        {
                            "name": "vllm" if i == 0 else f"sidecar{i}",
                            "image": "ghcr.io/gdn-operator/vllm-gdn:test",
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}} if i == 0 else {},
                        }
                        for i in range(containers)
                    ],
                },
            },
        },
    }


def _running_pod(api, ns: str, app: str) -> client.V1Pod:
    core = client.CoreV1Api(api)

    def running():
        pods = core.list_namespaced_pod(ns, label_selector=f"app={app}").items
        return next((p for p in pods if p.status.phase == "Running" and p.status.pod_ip), None)

    return wait_for(running, what=f"a Running pod of {app}")


def test_control_plane_reuses_the_sessions_full_cluster(control_plane, kube_api, full_cluster, tmp_path_factory):
    """tests/conftest.py: a session that needs the full cluster serves ``control_plane`` from it instead of
    starting a second (core) control plane."""
    assert control_plane is full_cluster and control_plane.tier == "full"
    assert kube_api.configuration.host == full_cluster.server
    assert all(full_cluster.alive().values()) and "kube-scheduler" in full_cluster.alive()
    # a core control plane would have made its work dir under the session's base temp dir
    assert not list(tmp_path_factory.getbasetemp().glob("control-plane*"))
    assert client.VersionApi(kube_api).get_code().git_version == full_cluster.binaries.k8s_version


def test_fake_gpu_nodes_advertise_gpus(full_cluster, api):
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    assert set(full_cluster.node_names) <= set(nodes)
    assert len(full_cluster.node_names) == full_cluster.gpu_nodes == 2
    for name in full_cluster.node_names:
        n = nodes[name]
        assert n.status.allocatable[GPU_RESOURCE] == "8"
        assert n.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert {c.type: c.status for c in n.status.conditions}["Ready"] == "True"


def test_gpu_deployment_pod_runs_on_fake_node_with_loopback_ip(full_cluster, api, ns):
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(ns, _deployment("one-gpu", gpus=1))
    pod = _running_pod(api, ns, "one-gpu")

    assert pod.spec.node_name in full_cluster.node_names
    ip = ipaddress.ip_address(pod.status.pod_ip)
    assert ip.is_loopback and ip in ipaddress.ip_network(full_cluster.pod_cidr)
    assert pod.status.container_statuses[0].ready is True
    assert pod.status.container_statuses[0].restart_count == 0

    dep = wait_for(
        lambda: (d := apps.read_namespaced_deployment("one-gpu", ns)).status.ready_replicas == 1 and d,
        what="Deployment readyReplicas=1",
    )
    assert dep.status.available_replicas == 1


def test_pod_asking_for_more_gpus_than_any_node_stays_unschedulable(api, ns):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "sixteen-gpus"},
            "spec": {"containers": [{"name": "vllm", "image": "x", "resources": {"limits": {GPU_RESOURCE: "16"}}}]},
        },
    )

    def unschedulable():
        p = core.read_namespaced_pod("sixteen-gpus", ns)
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return p, c
        return None

    pod, cond = wait_for(unschedulable, what="PodScheduled=False/Unschedulable")
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    assert "Insufficient nvidia.com/gpu" in cond.message

    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=sixteen-gpus,reason=FailedScheduling").items
    assert events and "Insufficient nvidia.com/gpu" in events[0].message


def test_crash_stage_sets_last_state_and_restart_count(api, ns):
    core = client.CoreV1Api(api)
    client.AppsV1Api(api).create_namespaced_deployment(ns, _deployment("crashy", gpus=1, containers=2))
    pod = _running_pod(api, ns, "crashy")
    name, ip = pod.metadata.name, pod.status.pod_ip

    msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    core.patch_namespaced_pod(
        name,
        ns,
        {
            "metadata": {
                "annotations": {CRASH_ANNOTATION: msg, CRASH_EXIT_CODE_ANNOTATION: "137", CRASH_CONTAINER_ANNOTATION: "vllm"}
            }
        },
    )

    def restarted(n: int):
        def check():
            p = core.read_namespaced_pod(name, ns)
            st = {c.name: c for c in p.status.container_statuses}
            if st["vllm"].restart_count == n and CRASH_ANNOTATION not in (p.metadata.annotations or {}):
                return p
            return None

        return check

    p = wait_for(restarted(1), what="restartCount=1 and trigger cleared")
    st = {c.name: c for c in p.status.container_statuses}
    term = st["vllm"].last_state.terminated
    assert term.message == msg
    assert term.exit_code == 137
    assert term.reason == "Error"
    assert st["vllm"].state.running is not None
    assert st["vllm"].ready is True
    # Only the named container crashed; the other keeps its state.
    assert st["sidecar1"].restart_count == 0
    assert st["sidecar1"].last_state.terminated is None
    assert st["sidecar1"].state.running is not None
    # The pod is still the same running pod with the same IP (a restart, not a reschedule).
    assert p.status.phase == "Running" and p.status.pod_ip == ip

    # Re-triggerable: a second crash bumps restartCount and replaces the message.
    msg2 = "RuntimeError: Engine core initialization failed. See root cause above."
    core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {CRASH_ANNOTATION: msg2}}})
    p = wait_for(restarted(2), what="restartCount=2")
    term = {c.name: c for c in p.status.container_statuses}["vllm"].last_state.terminated
    assert term.message == msg2
    assert term.exit_code == 1  # default exit code when the annotation is absent

    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},reason=BackOff").items
    assert events, "the crash stage records a BackOff event"


def test_kwok_chaos_stage_fails_a_bare_pod(api, ns):
    core = client.CoreV1Api(api)
    prefix = "pod-container-running-failed.stage.kwok.x-k8s.io"
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {
                "name": "doomed",
                "labels": {prefix: "true"},
                "annotations": {f"{prefix}/message": "engine died", f"{prefix}/exit-code": "3", f"{prefix}/delay": "1s"},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "vllm", "image": "x"}]},
        },
    )
    p = wait_for(lambda: (x := core.read_namespaced_pod("doomed", ns)).status.phase == "Failed" and x, what="phase Failed")
    term = p.status.container_statuses[0].state.terminated
    assert term.exit_code == 3
    assert term.message == "engine died"


def test_deleted_pods_go_away(api, ns):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, {"metadata": {"name": "gone"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    wait_for(lambda: core.read_namespaced_pod("gone", ns).status.phase == "Running", what="Running")
    core.delete_namespaced_pod("gone", ns)

    def gone():
        try:
            core.read_namespaced_pod("gone", ns)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for(gone, what="pod deleted (kwok pod-delete stage)")
