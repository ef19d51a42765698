"""Engine pods: the summary of each pod kept in kopf's index, and lookups in it.

Pods are kept in a kopf index keyed by (namespace, server) (`engine_pods`, registered in handlers/main.py),
so status is computed from all of a server's pods at once (Ready, Unschedulable), never from a single
event; the acceptance scraper and the output probes read the same index.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

from gdn_operator.handlers import kube
from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SERVER
from gdn_operator.render.engine import CONTAINER
from gdn_operator.render.lws import is_leader


def engine_fingerprint(container: dict[str, Any] | None) -> str:
    """Identity of what an engine container runs (image + argv): equal for a pod and the Deployment
    template rendered from the spec it runs, so a pod of a previous spec is recognised (output probes)."""
    if not container:
        return ""
    raw = json.dumps([container.get("image"), container.get("args") or [], container.get("command") or []])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def pod_summary(body: dict[str, Any]) -> dict[str, Any]:
    status = body.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    sched = conds.get("PodScheduled") or {}
    ready = conds.get("Ready") or {}
    restarts = sum(int(cs.get("restartCount") or 0) for cs in status.get("containerStatuses") or [])
    labels = body["metadata"].get("labels") or {}
    return {
        "name": body["metadata"]["name"],
        "uid": body["metadata"].get("uid"),
        "ip": status.get("podIP"),
        "phase": status.get("phase"),
        "ready": ready.get("status") == "True",
        "unschedulable": sched.get("status") == "False" and sched.get("reason") == "Unschedulable",
        "unschedulable_message": sched.get("message", ""),
        "node": (body.get("spec") or {}).get("nodeName"),
        "restarts": restarts,
        "deleting": bool(body["metadata"].get("deletionTimestamp")),
        "engine": engine_fingerprint(
            next((c for c in (body.get("spec") or {}).get("containers") or [] if c.get("name") == CONTAINER), None)
        ),
        # multi-node engines: which LeaderWorkerSet group, and whether this pod serves the API (the leader)
        "group": labels.get(LABEL_GROUP_INDEX),
        "leader": is_leader(labels),
    }


def engine_pods(
    body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    namespace = kube.require_namespace(namespace)
    server = labels.get(LABEL_SERVER)
    if not server:
        return {}
    return {(namespace, server): pod_summary(kube.plain(body))}


def pods_of(index: kopf.Index[tuple[str, str], dict[str, Any]], namespace: str, name: str) -> list[dict[str, Any]]:
    """The server's engine pods in kopf's index that are not being deleted (none yet for a server kopf has not
    indexed a pod of)."""
    return [p for p in index.get((namespace, name), []) if not p["deleting"]]


def api_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that serve the API and /metrics (headless workers of a multi-node group do not)."""
    return [p for p in pods if p.get("leader") is not False]
