"""Node drains against the engine PodDisruptionBudget: the DisruptionBlocked condition (issue 38).

A drain (`kubectl drain`, a managed node-pool upgrade, a cluster-autoscaler or Karpenter scale-down) first marks
the node — cordoned (`spec.unschedulable`, taint `node.kubernetes.io/unschedulable`) or tainted by the autoscaler —
then evicts its pods through the Eviction API, which answers 429 while the budget allows no disruption and leaves
no trace anyone else can see: the drain just waits. So the operator watches nodes for those marks
(`DrainingNodes`, fed by node events), and a server whose Ready engine pods sit on a marked node while its budget
allows no eviction gets `DisruptionBlocked=True` naming the pods, the nodes, the budget and the way out; `False`
once none is (never created just to say False).

The budget allows an eviction while ready pods − (pods − maxUnavailable) > 0 (the disruption controller's
arithmetic with the live pod count); pods that are not Ready never block (the budget's
unhealthyPodEvictionPolicy is AlwaysAllow, render/engine.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gdn_operator.api.rollout import DisruptionBudgetSpec
from gdn_operator.handlers.core import (
    conditions as st,  #: Taints that mark a node for a drain (NoSchedule / NoExecute), and what they mean.
)

DRAIN_TAINTS = {
    "node.kubernetes.io/unschedulable": "cordoned",
    "ToBeDeletedByClusterAutoscaler": "being removed by the cluster autoscaler",
    "karpenter.sh/disrupted": "being disrupted by Karpenter",
}
BLOCKED = "EvictionBlocked"
CLEARED = "NoEvictionBlocked"


def drain_mark(node: Mapping[str, Any]) -> str | None:
    """Why a node is being drained (None: it is not)."""
    spec = node.get("spec") or {}
    for taint in spec.get("taints") or []:
        why = DRAIN_TAINTS.get(taint.get("key", ""))
        if why and taint.get("effect") in ("NoSchedule", "NoExecute"):
            return why
    return "cordoned" if spec.get("unschedulable") else None


class DrainingNodes:
    """The nodes marked for a drain, as node events report them (one per runtime, handlers/runtime.py)."""

    def __init__(self) -> None:
        self.marks: dict[str, str] = {}

    def observe(self, node: str, mark: str | None) -> bool:
        """Record a node's mark (None: not draining, or gone). True when it changed."""
        if self.marks.get(node) == mark:
            return False
        if mark is None:
            del self.marks[node]
        else:
            self.marks[node] = mark
        return True


def budget_of(server: Mapping[str, Any]) -> int | None:
    """The rendered budget's maxUnavailable for a server body (None: no budget, or a spec admission refused)."""
    raw = (server.get("spec") or {}).get("disruptionBudget") or {}
    try:
        return DisruptionBudgetSpec.model_validate(raw).effective_max_unavailable
    except ValidationError:
        return None


def blocked(pods: list[dict[str, Any]], marks: Mapping[str, str], max_unavailable: int | None) -> list[dict[str, Any]]:
    """The Ready engine pods on a draining node that the budget keeps there (empty when it allows an eviction)."""
    if max_unavailable is None or not marks:
        return []
    live = [p for p in pods if not p.get("deleting")]
    ready = [p for p in live if p.get("ready")]
    if len(ready) - (len(live) - max_unavailable) > 0:
        return []
    return [{"pod": p["name"], "node": p["node"], "why": marks[p["node"]]} for p in ready if p.get("node") in marks]


def way_out(namespace: str, hits: list[dict[str, Any]], max_unavailable: int, ready: int, total: int) -> str:
    first = hits[0]["pod"]
    delete = f"or delete the pod yourself when traffic allows (kubectl delete pod -n {namespace} {first})"
    if max_unavailable == 0:
        return (
            "spec.disruptionBudget.maxUnavailable is 0 (the opt-in that keeps engines through drains): unset it (default "
            "1) to let the drain take the engine down and the workload recreate it elsewhere, scale to one more replica "
            f"(spec.replicas) so another engine serves while this one moves, {delete}"
        )
    return (
        f"only {ready} of {total} engine pods are Ready, so the budget (maxUnavailable {max_unavailable}) is used up: "
        "wait for the others to become Ready, raise spec.disruptionBudget.maxUnavailable, " + delete
    )


def set_blocked(
    status: dict[str, Any], obj: Mapping[str, Any], pods: list[dict[str, Any]], marks: Mapping[str, str]
) -> tuple[str, str, str] | None:
    """Write DisruptionBlocked into `status`; the Event of a transition (type, reason, message), or None."""
    gen = obj["metadata"].get("generation")
    budget = budget_of(obj)
    hits = blocked(pods, marks, budget)
    prev = st.get_condition(status, st.DISRUPTION_BLOCKED) or {}
    if hits and budget is not None:
        live = [p for p in pods if not p.get("deleting")]
        ready = sum(1 for p in live if p.get("ready"))
        where = ", ".join(f"{h['pod']} on node {h['node']} ({h['why']})" for h in hits[:5])
        more = f" and {len(hits) - 5} more" if len(hits) > 5 else ""
        msg = (
            f"a node drain cannot evict {len(hits)} engine pod(s): {where}{more}; PodDisruptionBudget "
            f"{obj['metadata']['name']} allows no disruption. Way out: {way_out(obj['metadata']['namespace'], hits, budget, ready, len(live))}"
        )
        st.set_condition(status, st.DISRUPTION_BLOCKED, True, BLOCKED, msg, gen)
        return ("Warning", BLOCKED, msg) if prev.get("status") != "True" else None
    if prev:
        st.set_condition(status, st.DISRUPTION_BLOCKED, False, CLEARED, "No node drain is waiting on an engine pod.", gen)
        return (
            ("Normal", CLEARED, "No node drain is waiting on an engine pod any more.") if prev.get("status") == "True" else None
        )
    return None
