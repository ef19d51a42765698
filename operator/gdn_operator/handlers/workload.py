"""Workload status and drift: Deployment (or LeaderWorkerSet) and pod events → GDNModelServer status;
edits undone.

Pod-derived status is computed from all of a server's pods at once (handlers/pods.py: kopf's index),
never from a single event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kubernetes.utils import parse_quantity

from gdn_operator import telemetry
from gdn_operator.handlers import conditions as st
from gdn_operator.handlers import kube
from gdn_operator.handlers.plan import PlanInputs, expected_objects
from gdn_operator.render import lws
from gdn_operator.render.scaleout import workload_of

log = logging.getLogger(__name__)


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return bool(parse_quantity(a) == parse_quantity(b))
    except (ValueError, TypeError):
        return False


def is_subset(want: Any, have: Any) -> bool:
    """True when every field we set is present with the same value. The API server adds defaults, drops
    empty strings and canonicalises quantities ("0.5" → "500m"), none of which is drift."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return False
        for k, v in want.items():
            if k not in have:
                if v in ("", None, [], {}):
                    continue
                return False
            if not is_subset(v, have[k]):
                return False
        return True
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(is_subset(a, b) for a, b in zip(want, have, strict=True))
    if want == have:
        return True
    if isinstance(want, (str, int, float)) and isinstance(have, (str, int, float)):
        return str(want) == str(have) or _same_quantity(want, have)
    return False


ROLLOUT_BLOCKED = "RolloutBlocked"


def block_rollout(status: dict[str, Any], obj: dict[str, Any], gen: Any) -> None:
    """Progressing=False (RolloutBlocked) while engine pods of a rollout cannot be scheduled: the rollout waits
    for GPUs (or nodes) that are not there, and says which setting avoids needing spare ones."""
    unsched = st.get_condition(status, st.UNSCHEDULABLE) or {}
    surge = ((obj.get("spec") or {}).get("rollout") or {}).get("strategy", "Surge") == "Surge"
    hint = ("free the GPUs a new engine needs, or set spec.rollout.strategy: InPlace (an old engine goes first, "
            "no spare GPUs needed)" if surge else "free the GPUs (or nodes) the engine needs")
    st.set_condition(status, st.PROGRESSING, False, ROLLOUT_BLOCKED,
                     f"The rollout cannot place its new pods: {unsched.get('message', '')}; {hint}.", gen)


def update_from_pods(namespace: str, name: str, pods: list[dict[str, Any]]) -> None:
    unsched = [p for p in pods if p["unschedulable"]]
    restarts = sum(p["restarts"] for p in pods)

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        if unsched:
            msg = unsched[0]["unschedulable_message"] or "no node has enough free nvidia.com/gpu"
            sp = obj.get("spec") or {}
            tp = int(sp.get("tensorParallelSize", 1)) * int(sp.get("pipelineParallelSize", 1)) // max(1, int(sp.get("nodes", 1)))
            st.set_condition(
                status,
                st.UNSCHEDULABLE,
                True,
                "InsufficientGPUs" if "nvidia.com/gpu" in msg else "Unschedulable",
                f"{len(unsched)} engine pod(s) cannot be scheduled (each needs {tp} nvidia.com/gpu on one node): {msg}",
                gen,
            )
            if st.is_true(status, st.PROGRESSING):
                block_rollout(status, obj, gen)
        elif st.get_condition(status, st.UNSCHEDULABLE) is not None:
            st.set_condition(status, st.UNSCHEDULABLE, False, "Scheduled", "All engine pods are scheduled.", gen)

    kube.update_status(namespace, name, mutate)
    telemetry.ENGINE_RESTARTS.labels(namespace, name).set(restarts)


async def pod_event(namespace: str, name: str, pods: list[dict[str, Any]]) -> None:
    """The workload's part of an engine pod event (handlers/main.py fans each out to the crash watch, then
    here): the server's pod-derived status, from all of its pods in kopf's index."""
    await asyncio.to_thread(update_from_pods, namespace, name, pods)


def deployment_status(namespace: str, name: str, dep: dict[str, Any], server: dict[str, Any] | None = None) -> None:
    """Status from the engine workload: a Deployment (replicas = pods) or a LeaderWorkerSet (replicas =
    groups; the LWS counts a group ready only when all of its pods are ready)."""
    spec = dep.get("spec") or {}
    dstatus = dep.get("status") or {}
    group_size = int(((spec.get("leaderWorkerTemplate") or {}).get("size")) or 1) if dep.get("kind") == "LeaderWorkerSet" else 1
    unit = "engine pods" if group_size == 1 else f"engine groups ({group_size} pods each)"
    replicas = spec.get("replicas")
    desired = int(replicas if replicas is not None else (1 if group_size > 1 else 0))
    ready = int(dstatus.get("readyReplicas") or 0)
    updated = int(dstatus.get("updatedReplicas") or 0)
    dconds = {c.get("type"): c for c in dstatus.get("conditions") or []}
    telemetry.READY_REPLICAS.labels(namespace, name).set(ready)
    telemetry.DESIRED_REPLICAS.labels(namespace, name).set(desired)

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        st.set_replicas(status, desired, ready, gen)
        if desired == 0:
            st.set_condition(status, st.READY, False, "ScaledToZero", "replicas is 0.", gen)
        elif ready >= desired:
            st.set_condition(status, st.READY, True, "EnginesReady", f"{ready}/{desired} {unit} ready.", gen)
        else:
            st.set_condition(status, st.READY, False, "EnginesNotReady", f"{ready}/{desired} {unit} ready.", gen)
        status["workload"] = dep.get("kind", "Deployment")
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

    kube.update_status(namespace, name, mutate, obj=server)


def correct_drift(rt: PlanInputs, namespace: str, name: str, dep: dict[str, Any] | None, server: dict[str, Any] | None = None,
                  kind: str = "Deployment") -> bool:
    """Re-apply the rendered Deployment if someone changed or deleted it. Returns True if corrected."""
    if server is None:
        server = kube.get_server(namespace, name)
    if server is None or server["metadata"].get("deletionTimestamp"):
        return False
    expected = expected_objects(server, rt)
    if expected is None:
        return False
    want = workload_of(expected)
    if kind != want["kind"]:
        return False  # the other workload kind (after a switch between 1 and several nodes): pruned by the reconciler
    if dep is not None and is_subset(want["spec"], dep.get("spec")) and is_subset(want["metadata"]["labels"], dep["metadata"].get("labels") or {}):
        return False
    kube.apply(want)
    log.info("drift corrected on %s/%s generation %s: engine %s %s outside the operator, re-applied", namespace, name,
             server["metadata"].get("generation"), want["kind"], "deleted" if dep is None else "edited")
    kube.emit_event(
        server,
        "DriftCorrected",
        f"Engine {want['kind']} was " + ("deleted" if dep is None else "edited") + " outside the operator; restored from the spec.",
        "Warning",
    )
    return True


async def deployment_event(rt: PlanInputs, type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta,
                           kind: str = "Deployment") -> None:
    """A Deployment or (multi-node engines) LeaderWorkerSet event: status and drift, the same for both."""
    namespace = kube.require_namespace(namespace)
    name = kube.owner_name(kube.plain(meta))
    if not name:
        return
    obj = kube.plain(body)
    obj.setdefault("kind", kind)
    await asyncio.to_thread(on_deployment, rt, namespace, name, None if type == "DELETED" else obj, kind)


def current_workload_kind(server: dict[str, Any]) -> str:
    return lws.KIND if int((server.get("spec") or {}).get("nodes") or 1) > 1 else "Deployment"


def on_deployment(rt: PlanInputs, namespace: str, name: str, dep: dict[str, Any] | None, kind: str = "Deployment") -> None:
    server = kube.get_server(namespace, name)
    if server is None:
        return
    correct_drift(rt, namespace, name, dep, server, kind)
    if dep is not None and kind == current_workload_kind(server):
        deployment_status(namespace, name, dep, server)
