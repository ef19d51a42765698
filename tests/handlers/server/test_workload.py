"""Pure parts of the workload handlers: drift comparison and pod summaries."""

import pytest

from gdn_operator.handlers.core.kube import owner_name, owner_ref
from gdn_operator.handlers.core.pods import pod_summary
from gdn_operator.handlers.server.workload import is_subset

from builders import EnginePod


def test_subset_ignores_server_defaults_but_sees_edits():
    want = {"replicas": 1, "template": {"spec": {"containers": [{"name": "vllm", "args": ["a", "b"]}]}}}
    have = {
        "replicas": 1,
        "progressDeadlineSeconds": 600,
        "template": {
            "spec": {
                "dnsPolicy": "ClusterFirst",
                "containers": [{"name": "vllm", "args": ["a", "b"], "terminationMessagePath": "/dev/termination-log"}],
            }
        },
    }
    assert is_subset(want, have)
    edited = {**have, "template": {"spec": {"containers": [{"name": "vllm", "args": ["a", "--enforce-eager"]}]}}}
    assert not is_subset(want, edited)
    assert not is_subset(want, {**have, "replicas": 3})
    assert not is_subset({"a": [1, 2]}, {"a": [1, 2, 3]})


def test_subset_treats_quantities_as_strings():
    assert is_subset({"limits": {"nvidia.com/gpu": "2"}}, {"limits": {"nvidia.com/gpu": "2"}})
    assert is_subset({"port": 8000}, {"port": "8000"})


def test_subset_accepts_what_the_api_server_canonicalises():
    # review finding: "0.5" CPU comes back as "500m", 1.5Gi as 1536Mi, empty strings are dropped
    assert is_subset({"cpu": "0.5", "memory": "1.5Gi"}, {"cpu": "500m", "memory": "1536Mi"})
    assert is_subset({"env": [{"name": "X", "value": ""}]}, {"env": [{"name": "X"}]})
    assert not is_subset({"cpu": "1"}, {"cpu": "500m"})
    assert not is_subset({"env": [{"name": "X", "value": "1"}]}, {"env": [{"name": "X"}]})


def test_owner_name():
    meta = {
        "ownerReferences": [
            {"kind": "ReplicaSet", "name": "x", "controller": True},
            {"kind": "GDNModelServer", "name": "srv", "uid": "u1", "controller": True},
        ]
    }
    assert owner_name(meta) == "srv"
    assert owner_name({}) is None
    assert owner_ref(meta) == {"kind": "GDNModelServer", "name": "srv", "uid": "u1", "controller": True}
    assert owner_ref({"ownerReferences": [{"kind": "GDNModelServer", "name": "srv"}]}) is None  # not its controller


def test_pod_summary_unschedulable_and_restarts():
    pod = (
        EnginePod()
        .uid("u")
        .phase("Pending")
        .condition(
            "PodScheduled", "False", reason="Unschedulable", message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
        )
        .container(restartCount=2)
        .container("sidecar", restartCount=1)
        .obj()
    )
    s = pod_summary(pod)
    assert s["unschedulable"] and "Insufficient nvidia.com/gpu" in s["unschedulable_message"]
    assert s["restarts"] == 3 and not s["ready"] and not s["deleting"]


def test_handlers_of_namespaced_resources_require_the_namespace():
    """kopf types `namespace` Optional (cluster-scoped resources); the pods, workloads and servers this
    operator watches always carry one, and a missing one fails loudly instead of reaching the API as None."""
    from gdn_operator.handlers.core import kube

    assert kube.require_namespace("team-a") == "team-a"
    with pytest.raises(ValueError, match="no namespace for an event of a namespaced resource"):
        kube.require_namespace(None)


# ------------------------------------------------------- issue 29: a rollout that cannot place its pods ---

from gdn_operator.handlers.core import conditions as st  # noqa: E402
from gdn_operator.handlers.core import statusguard  # noqa: E402
from gdn_operator.handlers.core.servers import Servers  # noqa: E402
from gdn_operator.handlers.server import workload as wl  # noqa: E402
from gdn_operator.handlers.server.workloadstatus import ROLLOUT_BLOCKED  # noqa: E402


@pytest.fixture
def server(monkeypatch):
    server = obj = {"metadata": {"name": "s", "namespace": "ns", "generation": 2}, "spec": {}, "status": {}}

    monkeypatch.setattr(statusguard, "update_status", lambda ns, n, mutate, obj=None, **kw: mutate(server["status"], server))
    return obj


def rolling(updated=0, ready=1):
    return {
        "kind": "Deployment",
        "spec": {"replicas": 1},
        "status": {
            "replicas": 2,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}],
        },
    }


PENDING = {
    "unschedulable": True,
    "unschedulable_message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    "restarts": 0,
}


@pytest.mark.parametrize("strategy, hint", [(None, "spec.rollout.strategy: InPlace"), ("InPlace", "free the GPUs")])
def test_surge_rollout_without_spare_gpus_is_progressing_false_with_the_reason(server, strategy, hint):
    if strategy:
        server["spec"]["rollout"] = {"strategy": strategy}
    wl.deployment_status("ns", "s", rolling(), server, Servers())
    assert st.get_condition(server["status"], st.PROGRESSING)["reason"] == "RollingOut"
    wl.update_from_pods("ns", "s", [PENDING], Servers())  # the surge pod finds no free GPU
    cond = st.get_condition(server["status"], st.PROGRESSING)
    assert (cond["status"], cond["reason"]) == ("False", ROLLOUT_BLOCKED)
    assert "Insufficient nvidia.com/gpu" in cond["message"] and hint in cond["message"]
    wl.deployment_status("ns", "s", rolling(), server, Servers())  # a later Deployment event does not hide it
    assert st.get_condition(server["status"], st.PROGRESSING)["reason"] == ROLLOUT_BLOCKED
    wl.update_from_pods("ns", "s", [{**PENDING, "unschedulable": False}], Servers())  # scheduled: rolling again
    wl.deployment_status("ns", "s", rolling(updated=1), server, Servers())
    assert st.get_condition(server["status"], st.PROGRESSING)["reason"] == "RollingOut"


# ------------------------------------------------ issue 38: status.selector for the scale subresource ---

from gdn_operator.api.load import parse_spec  # noqa: E402
from gdn_operator.handlers.server.workloadstatus import workload_status  # noqa: E402
from gdn_operator.render.engine import deployment  # noqa: E402
from gdn_operator.render.lws import leader_worker_set  # noqa: E402

from builders import GMS  # noqa: E402


def _labels(selector: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in selector.split(","))


def test_status_selector_selects_the_pods_replicas_count():
    obj = {"metadata": {"name": "srv", "generation": 1}}
    single = deployment("srv", "ns", parse_spec(GMS().version("0.32.0").spec()))
    status: dict = {}
    workload_status(status, obj, {**single, "status": {"replicas": 1}})
    assert _labels(status["selector"]) == single["spec"]["selector"]["matchLabels"]  # every engine pod
    multi = leader_worker_set("srv", "ns", parse_spec(GMS().version("0.32.0").update(nodes=2, tensorParallelSize=2).spec()))
    workload_status(status, obj, {**multi, "status": {"replicas": 1}})
    leader = multi["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    sel = _labels(status["selector"])
    assert sel.pop("leaderworkerset.sigs.k8s.io/worker-index") == "0"  # the leader (the LWS controller labels pods)
    assert sel.items() <= leader.items()
