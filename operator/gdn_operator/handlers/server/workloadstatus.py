"""What a server's engine workload (a Deployment, or a LeaderWorkerSet for multi-node engines) says of its
status: replicas, Ready, Progressing (RollingOut, RolloutComplete, RolloutBlocked). Pure functions over the
status dict, shared by the workload's event handler (handlers/server/workload.py) and the reconcile
(handlers/server/reconcile.py), which writes what a new workload's first event would, in its one status write.
"""

from __future__ import annotations

from typing import Any

from gdn_operator.handlers.core import conditions as st
from gdn_operator.labels import LEADER_SELECTOR
from gdn_operator.render.meta import selector_labels

ROLLOUT_BLOCKED = "RolloutBlocked"


def block_rollout(status: dict[str, Any], obj: dict[str, Any], gen: Any) -> None:
    """Progressing=False (RolloutBlocked) while engine pods of a rollout cannot be scheduled: the rollout waits
    for GPUs (or nodes) that are not there, and says which setting avoids needing spare ones."""
    unsched = st.get_condition(status, st.UNSCHEDULABLE) or {}
    surge = ((obj.get("spec") or {}).get("rollout") or {}).get("strategy", "Surge") == "Surge"
    hint = (
        "free the GPUs a new engine needs, or set spec.rollout.strategy: InPlace (an old engine goes first, no spare GPUs needed)"
        if surge
        else "free the GPUs (or nodes) the engine needs"
    )
    st.set_condition(
        status,
        st.PROGRESSING,
        False,
        ROLLOUT_BLOCKED,
        f"The rollout cannot place its new pods: {unsched.get('message', '')}; {hint}.",
        gen,
    )


#: status key: the engine workload's kind (Deployment or LeaderWorkerSet)
WORKLOAD = "workload"


def record_workload_kind(status: dict[str, Any], kind: str) -> None:
    """The kind of the workload the reconcile is about to apply, until that workload's events say (a kind
    already recorded is the events' to change)."""
    status.setdefault(WORKLOAD, kind)


def workload_status(status: dict[str, Any], obj: dict[str, Any], dep: dict[str, Any]) -> None:
    """What server `obj`'s engine workload `dep` says of it (replicas, Ready, Progressing, workload, groupSize),
    written into `status`: a Deployment (replicas = pods) or a LeaderWorkerSet (replicas = groups; the LWS
    counts a group ready only when all of its pods are ready). Pure; the reconcile also runs it on the
    workload it is about to create (no status yet), so that workload's first event finds nothing to write."""
    gen = obj["metadata"].get("generation")
    dstatus = dep.get("status") or {}
    group_size = _group_size(dep)
    unit = "engine pods" if group_size == 1 else f"engine groups ({group_size} pods each)"
    desired, ready = workload_replicas(dep)
    updated = int(dstatus.get("updatedReplicas") or 0)
    dconds = {c.get("type"): c for c in dstatus.get("conditions") or []}
    st.set_replicas(status, desired, ready, gen)
    if desired == 0:
        st.set_condition(status, st.READY, False, "ScaledToZero", "replicas is 0.", gen)
    elif ready >= desired:
        st.set_condition(status, st.READY, True, "EnginesReady", f"{ready}/{desired} {unit} ready.", gen)
    else:
        st.set_condition(status, st.READY, False, "EnginesNotReady", f"{ready}/{desired} {unit} ready.", gen)
    status[WORKLOAD] = dep.get("kind", "Deployment")
    status["selector"] = scale_selector(obj["metadata"]["name"], group_size > 1)
    if group_size > 1:
        status["groupSize"] = group_size
    else:
        status.pop("groupSize", None)
    prog = dconds.get("Progressing") or {}
    rolled = updated >= desired and ready >= desired and int(dstatus.get("replicas") or 0) <= desired
    if prog.get("reason") == "ProgressDeadlineExceeded":
        st.set_condition(status, st.PROGRESSING, False, "ProgressDeadlineExceeded", prog.get("message", ""), gen)
    elif rolled:
        st.set_condition(status, st.PROGRESSING, False, "RolloutComplete", "All engine pods run the current spec.", gen)
    elif st.is_true(status, st.UNSCHEDULABLE):
        block_rollout(status, obj, gen)
    else:
        st.set_condition(
            status, st.PROGRESSING, True, "RollingOut", f"{updated}/{desired} updated, {ready}/{desired} ready.", gen
        )
    # 0 < ready < desired: Degraded PartiallyReady, derived from Ready (conditions.refresh_degraded)


def scale_selector(name: str, groups: bool) -> str:
    """status.selector: the pods status.replicas counts, as a label selector string (the scale subresource's
    labelSelectorPath): every engine pod, or one pod per group (the leader) when replicas count groups."""
    labels = {**selector_labels(name), **(LEADER_SELECTOR if groups else {})}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _group_size(dep: dict[str, Any]) -> int:
    if dep.get("kind") != "LeaderWorkerSet":
        return 1
    return int((((dep.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size")) or 1)


def workload_replicas(dep: dict[str, Any]) -> tuple[int, int]:
    """(desired, ready) replicas of a Deployment or LeaderWorkerSet (a multi-pod LWS without replicas runs one group)."""
    replicas = (dep.get("spec") or {}).get("replicas")
    desired = int(replicas if replicas is not None else (1 if _group_size(dep) > 1 else 0))
    return desired, int((dep.get("status") or {}).get("readyReplicas") or 0)
