"""Engine pods: the summary of each pod kept in kopf's index, and lookups in it.

Pods are kept in a kopf index keyed by (namespace, server) (`engine_pods`, registered in handlers/main.py),
so status is computed from all of a server's pods at once (Ready, Unschedulable, StartFailed: an image that
cannot be pulled, a model download that fails), never from a single
event; the acceptance scraper and the output probes read the same index.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

from gdn_operator.handlers.core import kube
from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SERVER
from gdn_operator.render.engine import CONTAINER
from gdn_operator.render.lws import is_leader
from gdn_operator.render.podparts import DOWNLOAD_CONTAINER


def engine_fingerprint(container: dict[str, Any] | None) -> str:
    """Identity of what an engine container runs (image + argv): equal for a pod and the Deployment
    template rendered from the spec it runs, so a pod of a previous spec is recognised (output probes)."""
    if not container:
        return ""
    raw = json.dumps([container.get("image"), container.get("args") or [], container.get("command") or []])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


#: Waiting reasons with which the kubelet reports an image it cannot pull (kubelet's images package).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
MODEL_DOWNLOAD_FAILED = "ModelDownloadFailed"
IMAGE_PULL_FAILED = "ImagePullFailed"
_MESSAGE_CHARS = 600


def _download_failure(cs: dict[str, Any]) -> str | None:
    """The termination message of the download step while it fails (its last failed run, the end of its
    log), None once it completed or while it has not failed."""
    state, last = cs.get("state") or {}, cs.get("lastState") or {}
    done = state.get("terminated")
    if done is not None and int(done.get("exitCode") or 0) == 0:
        return None
    failed = done if done is not None else last.get("terminated")
    if failed is None or int(failed.get("exitCode") or 0) == 0:
        return None
    text = (failed.get("message") or failed.get("reason") or "").strip()
    return text[-_MESSAGE_CHARS:] or f"exit code {failed.get('exitCode')}"


def start_failure(status: dict[str, Any]) -> tuple[str, str] | None:
    """Why a pod cannot start, from what the kubelet reports: (ImagePullFailed, container: message) for an
    image that cannot be pulled, (ModelDownloadFailed, the download step's last words) for a download that
    fails; None otherwise. An image that cannot be pulled comes first (the download step never ran)."""
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            msg = (waiting.get("message") or "").strip()[-_MESSAGE_CHARS:]
            return IMAGE_PULL_FAILED, f"{cs.get('name')}: {waiting['reason']}: {msg or cs.get('image', '')}"
    for cs in status.get("initContainerStatuses") or []:
        if cs.get("name") == DOWNLOAD_CONTAINER and (text := _download_failure(cs)) is not None:
            return MODEL_DOWNLOAD_FAILED, f"{DOWNLOAD_CONTAINER}: {text}"
    return None


def pod_summary(body: dict[str, Any], container: str = CONTAINER) -> dict[str, Any]:
    """What status, the acceptance scrape, the probes and the stall watch read of a pod (`container`: the engine
    container's name, the operator's own or the one a GDNGuard names)."""
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
        "start_failure": start_failure(status),
        "deleting": bool(body["metadata"].get("deletionTimestamp")),
        "engine": engine_fingerprint(
            next((c for c in (body.get("spec") or {}).get("containers") or [] if c.get("name") == container), None)
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
    return {(namespace, server): pod_summary(kube.plain_object(body))}


def pods_of(index: kopf.Index[tuple[str, str], dict[str, Any]], namespace: str, name: str) -> list[dict[str, Any]]:
    """The server's engine pods in kopf's index that are not being deleted (none yet for a server kopf has not
    indexed a pod of)."""
    return [p for p in index.get((namespace, name), []) if not p["deleting"]]


def api_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that serve the API and /metrics (headless workers of a multi-node group do not)."""
    return [p for p in pods if p.get("leader") is not False]
