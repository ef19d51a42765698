"""Issue 38 on the real control plane (kube-apiserver, kube-controller-manager's disruption controller, kwok
nodes): the default engine PodDisruptionBudget lets a drain evict a one-replica server's engine; the opt-in
`maxUnavailable: 0` makes the Eviction API refuse (429), and the operator says so (DisruptionBlocked, naming the
way out) until the way out is taken; the workload object carries spec.pod.workloadLabels; every write the
operator makes is named after it in managedFields (no `OpenAPI-Generator`)."""

from __future__ import annotations

import contextlib

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from operator_harness import gms, running_operator, wait_for


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-daytwo")) as proc:
        yield proc


@contextlib.contextmanager
def cordoned(core, node: str):
    """`kubectl cordon` (the first step of every drain), undone afterwards: the session shares its nodes."""
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        yield node
    finally:
        core.patch_node(node, {"spec": {"unschedulable": None}})


def evict(core, ns: str, pod: str) -> int:
    """One eviction as `kubectl drain` sends it: 201 evicted, 429 refused by a PodDisruptionBudget."""
    try:
        core.create_namespaced_pod_eviction(pod, ns, {"metadata": {"name": pod, "namespace": ns}})
    except ApiException as e:
        return e.status
    return 201


def _pdb(policy, ns, name):
    try:
        return policy.read_namespaced_pod_disruption_budget(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _settled_pdb(policy, ns, name, max_unavailable):
    """The budget once the disruption controller has counted the Ready engine pod under `max_unavailable`."""

    def check():
        pdb = _pdb(policy, ns, name)
        if pdb is None or pdb.spec.max_unavailable != max_unavailable or not pdb.status:
            return None
        if pdb.status.observed_generation != pdb.metadata.generation or pdb.status.current_healthy != 1:
            return None
        return pdb

    return wait_for(check, 60, what=f"PodDisruptionBudget {name} maxUnavailable {max_unavailable}, 1 healthy")


@pytest.mark.timeout(400)
def test_default_budget_lets_a_drain_evict_the_only_engine(op, k, ns, kube_api):
    core, policy = k.core, kubernetes.client.PolicyV1Api(kube_api)
    k.create(ns, gms("drained"))
    pod = k.ready_pod(ns, "drained")
    pdb = _settled_pdb(policy, ns, "drained", 1)
    assert pdb.status.disruptions_allowed == 1  # the old default (0 for one replica) blocked every drain forever
    with cordoned(core, pod.spec.node_name):
        assert evict(core, ns, pod.metadata.name) == 201
        moved = k.ready_pod(ns, "drained", not_named=pod.metadata.name)
        assert moved.spec.node_name != pod.spec.node_name  # the Deployment recreated it on another node
    assert (k.condition(ns, "drained", "DisruptionBlocked") or {}).get("status") != "True"


@pytest.mark.timeout(400)
def test_opt_in_protection_blocks_the_drain_and_the_condition_names_the_way_out(op, k, ns, kube_api):
    core, policy = k.core, kubernetes.client.PolicyV1Api(kube_api)
    k.create(ns, gms("guarded", disruptionBudget={"maxUnavailable": 0}))
    pod = k.ready_pod(ns, "guarded")
    node = pod.spec.node_name
    assert _settled_pdb(policy, ns, "guarded", 0).status.disruptions_allowed == 0
    with cordoned(core, node):
        assert evict(core, ns, pod.metadata.name) == 429  # what `kubectl drain` retries forever
        c = k.wait_condition(ns, "guarded", "DisruptionBlocked", "True", timeout=60, reason="EvictionBlocked")
        msg = c["message"]
        assert f"{pod.metadata.name} on node {node} (cordoned)" in msg and "PodDisruptionBudget guarded" in msg
        assert "spec.disruptionBudget.maxUnavailable is 0" in msg and f"kubectl delete pod -n {ns} {pod.metadata.name}" in msg
        evs = wait_for(lambda: k.events(ns, "guarded", "EvictionBlocked"), 30, what="EvictionBlocked Event")
        assert [e.type for e in evs] == ["Warning"]
        assert k.get(ns, "guarded")["status"]["phase"] == "Ready"  # a blocked drain does not degrade serving

        # the way out the message names first: unset maxUnavailable (default 1); the drain's retry then succeeds
        k.patch(ns, "guarded", {"spec": {"disruptionBudget": {"maxUnavailable": None}}})
        wait_for(lambda: evict(core, ns, pod.metadata.name) == 201, 60, what="eviction allowed by the default budget")
        k.wait_condition(ns, "guarded", "DisruptionBlocked", "False", timeout=60, reason="NoEvictionBlocked")
        assert k.ready_pod(ns, "guarded", not_named=pod.metadata.name).spec.node_name != node


def test_workload_labels_on_the_deployment_and_every_write_names_its_field_manager(op, k, ns):
    obj = gms(
        "labelled",
        pod={"workloadLabels": {"kueue.x-k8s.io/queue-name": "gpu"}, "workloadAnnotations": {"example.com/team": "ml"}},
    )
    k.create(ns, obj)
    dep = wait_for(lambda: _deployment(k, ns, "labelled"), 60, what="engine Deployment")
    assert dep.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu" and dep.metadata.annotations["example.com/team"] == "ml"
    k.wait_condition(ns, "labelled", "Ready", "True", timeout=90)
    server = k.co.get_namespaced_custom_object("serving.gdn-operator.io", "v1alpha1", ns, "gdnmodelservers", "labelled")
    # (the test's own create is this client's, "OpenAPI-Generator"; the status is written by the operator only)
    status_managers = {m["manager"] for m in server["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert "gdn-operator" in status_managers and status_managers <= {"gdn-operator", "kopf"}, status_managers
    ours = [e for e in k.events(ns, "labelled") if e.reporting_component == "gdn-operator"]
    assert ours and {e.metadata.managed_fields[0].manager for e in ours} == {"gdn-operator"}


def _deployment(k, ns, name):
    try:
        return k.apps.read_namespaced_deployment(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
