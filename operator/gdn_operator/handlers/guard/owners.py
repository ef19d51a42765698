"""The workload a guarded pod belongs to, read (never written) from the owner chain: what a GDNGuard reports on
and where its Events go.

Pod → ReplicaSet → Deployment; Pod → StatefulSet; a LeaderWorkerSet's pods by their
``leaderworkerset.sigs.k8s.io/name`` label; and above a Deployment or StatefulSet the object that controls it,
when one does (KServe's LLMInferenceService, KAITO's Workspace, any creator), named by its ownerReference
without reading it. A pod without a controller is its own workload. Owner objects are read once and cached by
uid (an owner chain does not change); a chain that cannot be read (gone, or RBAC) stops where it is known. The
reads are handlers/guard/client.py's.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

from gdn_operator.handlers.guard import client
from gdn_operator.watch.target import EngineTarget

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


@dataclass(frozen=True)
class WorkloadRef:
    """A guarded workload: what status lists and what its Events are about."""

    kind: str
    name: str
    api_version: str
    uid: str | None = None

    def event_target(self, namespace: str) -> dict[str, Any]:
        """The object an Event on this workload names (kube.emit_event's `obj`)."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": {"name": self.name, "namespace": namespace, "uid": self.uid},
        }

    def engine_target(self, namespace: str) -> EngineTarget:
        """The key of this workload's engine state (acceptance windows, stall detectors, probes): its own kind, so
        a GDNModelServer or another kind's workload of the same name never shares it."""
        return EngineTarget(self.kind, namespace, self.name)


def controller_ref(meta: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)


def _ref(r: dict[str, Any]) -> WorkloadRef:
    return WorkloadRef(str(r.get("kind")), str(r.get("name")), str(r.get("apiVersion")), r.get("uid"))


class Owners:
    """Owner-chain reads, cached by uid (bounded): one GET per ReplicaSet / Deployment / StatefulSet ever."""

    def __init__(self, size: int = 8192) -> None:
        self._meta: collections.OrderedDict[str, dict[str, Any] | None] = collections.OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self.reads = 0  # API reads made (the scale bench reports it)

    def _metadata(self, namespace: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        uid = str(ref.get("uid") or f"{ref.get('kind')}/{ref.get('name')}")
        with self._lock:
            if uid in self._meta:
                return self._meta[uid]
        self.reads += 1
        meta = client.owner_metadata(str(ref.get("kind")), namespace, ref["name"])
        with self._lock:
            self._meta[uid] = meta
            if len(self._meta) > self._size:
                self._meta.popitem(last=False)
        return meta

    def workload_of(self, pod: dict[str, Any]) -> WorkloadRef:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        lws = (meta.get("labels") or {}).get(LWS_NAME_LABEL)
        if lws:
            return WorkloadRef("LeaderWorkerSet", lws, LWS_API_VERSION)
        ref = controller_ref(meta)
        if ref is None:
            return WorkloadRef("Pod", meta["name"], "v1", meta.get("uid"))
        for _ in range(3):  # Pod → ReplicaSet → Deployment → its controller, at most
            if ref.get("kind") not in client.OWNER_KINDS:
                return _ref(ref)
            owner = self._metadata(namespace, ref)
            up = controller_ref(owner) if owner is not None else None
            if up is None:
                return _ref(ref)
            ref = up
        return _ref(ref)
