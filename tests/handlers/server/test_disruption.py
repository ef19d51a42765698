"""The DisruptionBlocked decision (issue 38), pure: which nodes are being drained, when the engine budget keeps a
pod there, and what the condition says (the real drain against kube-apiserver's Eviction API is
tests/integration/test_day_two_cluster.py)."""

from __future__ import annotations

import pytest

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.server.disruption import DrainingNodes, blocked, budget_of, drain_mark, set_blocked


def pod(name, node, ready=True, deleting=False):
    return {"name": name, "node": node, "ready": ready, "deleting": deleting}


def server(budget=None, name="srv"):
    spec = {} if budget is None else {"disruptionBudget": budget}
    return {"metadata": {"name": name, "namespace": "ml", "generation": 3}, "spec": spec}


@pytest.mark.parametrize(
    ("node", "mark"),
    [
        ({"spec": {}}, None),
        ({"spec": {"unschedulable": True}}, "cordoned"),
        ({"spec": {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}, "cordoned"),
        (
            {"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}},
            "being removed by the cluster autoscaler",
        ),
        ({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}, "being disrupted by Karpenter"),
        ({"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}, None),  # an ordinary GPU taint
        ({"spec": {"taints": [{"key": "DeletionCandidateOfClusterAutoscaler", "effect": "PreferNoSchedule"}]}}, None),
    ],
)
def test_drain_marks(node, mark):
    assert drain_mark(node) == mark


def test_draining_nodes_report_changes_only():
    d = DrainingNodes()
    assert d.observe("n1", "cordoned") and not d.observe("n1", "cordoned")
    assert d.observe("n1", None) and d.marks == {} and not d.observe("n1", None)


def test_the_default_budget_never_blocks_a_one_replica_drain_the_opt_in_does():
    marks = {"n1": "cordoned"}
    assert budget_of(server()) == 1 and blocked([pod("p0", "n1")], marks, budget_of(server())) == []
    assert budget_of(server({"maxUnavailable": 0})) == 0
    assert blocked([pod("p0", "n1")], marks, 0) == [{"pod": "p0", "node": "n1", "why": "cordoned"}]
    assert budget_of(server({"enabled": False})) is None and blocked([pod("p0", "n1")], marks, None) == []


def test_one_at_a_time_blocks_while_another_engine_is_down_and_never_for_unready_pods():
    marks = {"n1": "cordoned"}
    assert blocked([pod("p0", "n1"), pod("p1", "n2")], marks, 1) == []  # one may go
    down = [pod("p0", "n1"), pod("p1", "n2", ready=False)]
    assert blocked(down, marks, 1) == [{"pod": "p0", "node": "n1", "why": "cordoned"}]
    assert blocked([pod("p0", "n1", ready=False)], marks, 0) == []  # unhealthyPodEvictionPolicy AlwaysAllow
    assert blocked([pod("p0", "n2")], marks, 0) == []  # not on a draining node


def test_condition_names_pods_nodes_and_the_way_out_and_clears_with_an_event():
    status: dict = {}
    obj = server({"maxUnavailable": 0})
    event = set_blocked(status, obj, [pod("srv-0", "gpu-1")], {"gpu-1": "cordoned"})
    c = st.get_condition(status, st.DISRUPTION_BLOCKED)
    assert (c["status"], c["reason"]) == ("True", "EvictionBlocked") and event[:2] == ("Warning", "EvictionBlocked")
    msg = c["message"]
    assert "srv-0 on node gpu-1 (cordoned)" in msg and "PodDisruptionBudget srv" in msg
    assert "spec.disruptionBudget.maxUnavailable is 0" in msg and "spec.replicas" in msg
    assert "kubectl delete pod -n ml srv-0" in msg
    assert set_blocked(status, obj, [pod("srv-0", "gpu-1")], {"gpu-1": "cordoned"}) is None  # no repeat
    event = set_blocked(status, obj, [pod("srv-0", "gpu-1")], {})
    assert st.get_condition(status, st.DISRUPTION_BLOCKED)["status"] == "False" and event[:2] == ("Normal", "NoEvictionBlocked")
    untouched: dict = {}
    assert set_blocked(untouched, server(), [pod("srv-0", "gpu-1")], {"gpu-1": "cordoned"}) is None
    assert untouched == {}  # never created just to say False
