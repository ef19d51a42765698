"""Workload status and drift: Deployment (or LeaderWorkerSet) and pod events → GDNModelServer status;
edits undone.

Pod-derived status is computed from all of a server's pods at once (handlers/core/pods.py: kopf's index),
never from a single event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from gdn_operator import telemetry
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.kube import parse_quantity
from gdn_operator.handlers.core.plan import PlanInputs, expected_objects, plan_key
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.server import disruption
from gdn_operator.handlers.server.workloadstatus import block_rollout, workload_replicas, workload_status
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


def _start_failed(status: dict[str, Any], pods: list[dict[str, Any]], gen: Any) -> tuple[str, str] | None:
    """StartFailed from the pods' start failures (pods.start_failure); returns (reason, message) when it has
    just become True or changed reason (the caller emits the Event), else None."""
    failing = [p for p in pods if p.get("start_failure")]
    if failing:
        reason, first = failing[0]["start_failure"]
        message = f"{len(failing)} engine pod(s) cannot start ({failing[0]['name']}: {first})"
        before = st.get_condition(status, st.START_FAILED) or {}
        st.set_condition(status, st.START_FAILED, True, reason, message, gen)
        if before.get("status") != "True" or before.get("reason") != reason:
            return reason, message
    elif st.is_true(status, st.START_FAILED):
        st.set_condition(
            status, st.START_FAILED, False, "Started", "No engine pod fails to pull its image or download the model.", gen
        )
    return None


def update_from_pods(
    namespace: str,
    name: str,
    pods: list[dict[str, Any]],
    servers: Servers,
    draining: Mapping[str, str] | None = None,
) -> None:
    """Pod-derived status (Unschedulable, StartFailed; DisruptionBlocked from `draining`, the nodes marked for a
    drain), from the newest server body `servers` holds (no read; most pod events change nothing, and a
    stale body only costs the guarded patch a re-read). A start failure that appears (or changes reason) also gets
    a Warning Event on the server."""
    unsched = [p for p in pods if p["unschedulable"]]
    restarts = sum(p["restarts"] for p in pods)
    events: list[tuple[str, str, str]] = []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        if draining or st.get_condition(status, st.DISRUPTION_BLOCKED) is not None:
            event = disruption.set_blocked(status, obj, pods, draining or {})
            if event is not None:
                events.append(event)
        gen = obj["metadata"].get("generation")
        failed = _start_failed(status, pods, gen)
        if failed is not None:
            events.append(("Warning", failed[0], failed[1]))
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

    obj = servers.update_status(namespace, name, mutate)
    if obj is not None:  # the events of the mutate that was written (a conflict re-runs it)
        for type_, reason, message in events:
            if reason in ("ModelDownloadFailed", "ImagePullFailed"):
                log.info("%s/%s: engine pods cannot start: %s", namespace, name, reason)
            kube.emit_event(obj, reason, message, type_)
    telemetry.ENGINE_RESTARTS.labels(namespace, name).set(restarts)


async def pod_event(
    namespace: str,
    name: str,
    pods: list[dict[str, Any]],
    servers: Servers,
    draining: Mapping[str, str] | None = None,
) -> None:
    """The workload's part of an engine pod event (handlers/main.py fans each out to the crash watch, then
    here), and of a node event that marks or unmarks a node with its pods: the server's pod-derived status,
    from all of its pods in kopf's index."""
    await asyncio.to_thread(update_from_pods, namespace, name, pods, servers, draining)


def deployment_status(namespace: str, name: str, dep: dict[str, Any], server: dict[str, Any] | None, servers: Servers) -> None:
    """Status from the engine workload (workload_status): one guarded status patch from the newest of `server`
    and the body `servers` holds (without either, one read), none when nothing changed."""
    desired, ready = workload_replicas(dep)
    telemetry.READY_REPLICAS.labels(namespace, name).set(ready)
    telemetry.DESIRED_REPLICAS.labels(namespace, name).set(desired)

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        workload_status(status, obj, dep)

    servers.update_status(namespace, name, mutate, obj=server)


def drifted(
    rt: PlanInputs, server: dict[str, Any], dep: dict[str, Any] | None, kind: str = "Deployment"
) -> dict[str, Any] | None:
    """The workload to re-apply when `dep` (None: deleted) is not what `server`'s spec renders; else None."""
    if server["metadata"].get("deletionTimestamp"):
        return None
    expected = expected_objects(server, rt)
    if expected is None:
        return None
    want = workload_of(expected)
    if kind != want["kind"]:
        return None  # the other workload kind (after a switch between 1 and several nodes): pruned by the reconciler
    if (
        dep is not None
        and is_subset(want["spec"], dep.get("spec"))
        and is_subset(want["metadata"]["labels"], dep["metadata"].get("labels") or {})
    ):
        return None
    return want


def correct_drift(
    rt: PlanInputs,
    namespace: str,
    name: str,
    dep: dict[str, Any] | None,
    server: dict[str, Any] | None = None,
    kind: str = "Deployment",
) -> bool:
    """Re-apply the rendered Deployment if someone changed or deleted it. Returns True if corrected."""
    if server is None:
        server = rt.servers.read(namespace, name)
    want = drifted(rt, server, dep, kind) if server is not None else None
    if server is None or want is None:
        return False
    restore(server, want, dep)
    return True


def restore(server: dict[str, Any], want: dict[str, Any], dep: dict[str, Any] | None) -> None:
    """Re-apply the workload `want` that `server`'s spec renders over `dep` (None: deleted)."""
    meta = server["metadata"]
    kube.apply(want)
    log.info(
        "drift corrected on %s/%s generation %s: engine %s %s outside the operator, re-applied",
        meta["namespace"],
        meta["name"],
        meta.get("generation"),
        want["kind"],
        "deleted" if dep is None else "edited",
    )
    kube.emit_event(
        server,
        "DriftCorrected",
        f"Engine {want['kind']} was "
        + ("deleted" if dep is None else "edited")
        + " outside the operator; restored from the spec.",
        "Warning",
    )


async def deployment_event(
    rt: PlanInputs, type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta, kind: str = "Deployment"
) -> None:
    """A Deployment or (multi-node engines) LeaderWorkerSet event: status and drift, the same for both."""
    namespace = kube.require_namespace(namespace)
    ref = kube.owner_ref(meta)
    if ref is None or not ref.get("name"):
        return
    name, uid = ref["name"], ref.get("uid")
    obj = kube.plain_object(body)
    obj.setdefault("kind", kind)
    await asyncio.to_thread(on_deployment, rt, namespace, name, None if type == "DELETED" else obj, kind, uid)


def current_workload_kind(server: dict[str, Any]) -> str:
    return lws.KIND if int((server.get("spec") or {}).get("nodes") or 1) > 1 else "Deployment"


def on_deployment(
    rt: PlanInputs, namespace: str, name: str, dep: dict[str, Any] | None, kind: str = "Deployment", owner_uid: str | None = None
) -> None:
    """Drift, then status. The server is the newest body the operator has seen (rt.servers: no read); only a
    deleted workload, or one that differs from that body's spec, is checked again against a fresh read
    before anything is re-applied. The status write is a guarded patch: a stale body costs a re-read."""
    server = rt.servers.get(namespace, name, owner_uid)
    if server is not None and dep is not None and rt.servers.is_applying(namespace, name):
        # the operator's own apply of this workload is in flight (Servers.applying): not drift; its event checks
        log.debug("drift check of %s/%s skipped: the operator is applying its workload", namespace, name)
        want = None
    else:
        want = drifted(rt, server, dep, kind) if server is not None else None  # planned once for this event
    if server is None or dep is None or want is not None:
        fresh = rt.servers.read(namespace, name)  # drift correction acts only on what the API server holds
        if fresh is None:
            return
        # re-planned only when its inputs moved (or it is being deleted: nothing is restored then)
        if server is None or fresh["metadata"].get("deletionTimestamp") or plan_key(fresh) != plan_key(server):
            want = drifted(rt, fresh, dep, kind)
        server = fresh
        if want is not None:
            restore(server, want, dep)
    if dep is not None and kind == current_workload_kind(server):
        deployment_status(namespace, name, dep, server, rt.servers)
