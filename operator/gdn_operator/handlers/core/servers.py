"""The one door to a GDNModelServer: every read of a server and every write of its status goes through
`Servers` (one per operator run, held by the runtime). handlers/core/statusguard.py, the guarded status write and
the GET underneath, may be imported by this module only (the forbidden contract in pyproject.toml).

It keeps the newest body the operator has seen of each server, fed by every GDNModelServer watch event
(handlers/main.py, track_servers) and by the operator's own status writes (the object each patch returns), so
a Deployment event that arrives before the watch delivers the reconcile's status write still sees that write
(issue 29 part 9: a GET per Deployment event and per acceptance write was a third of the operator's requests
per server). Of two bodies the one with the higher resourceVersion is kept (etcd's revision; a version that
is not a number replaces the stored one).

Reads: `get` is the cache only; `current` the cache, or one GET when it holds nothing; `read` always one GET
(drift correction, which must see what the API server holds). Writes: `update_status` from the newest body it
holds (issue 37). A body from here may be stale (a write by someone else not delivered yet). That costs a
request, never a wrong write: status writes are JSON patches guarded by what they were computed from
(statusguard.status_patch), so a stale body fails its `test` and the write reads the object again.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gdn_operator.handlers.core import (
    kube,  #: Every status key: (the one module that writes it, what it holds). The schema is api/status.py; the writer of
    statusguard,
)

#: each condition type is conditions.CONDITIONS. tests/handlers/core/test_servers.py finds every write of a status
#: key in the source and checks it is made by the module named here.
STATUS: dict[str, tuple[str, str]] = {
    "observedGeneration": ("handlers/server/reconcile.py", "the generation the status describes"),
    "phase": ("handlers/core/conditions.py", "derived from the conditions (conditions.derive_phase)"),
    "conditions": ("handlers/core/conditions.py", "set through conditions.set_condition by the writers CONDITIONS names"),
    "replicas": ("handlers/core/conditions.py", "desired engine replicas (conditions.set_replicas: reconcile, workload)"),
    "readyReplicas": ("handlers/core/conditions.py", "ready engine replicas (conditions.set_replicas)"),
    "ready": ("handlers/core/conditions.py", "ready/desired, for kubectl (conditions.set_replicas)"),
    "findings": ("handlers/server/reconcile.py", "the known-issue rules that matched"),
    "advisories": ("handlers/server/reconcile.py", "the rules no spec value avoids"),
    "effective": ("handlers/server/reconcile.py", "the effective vLLM configuration"),
    "overrides": ("api/overrides.py", "the operator-owned overrides in force (set_overrides, add_override)"),
    "overridesCleared": ("handlers/server/reconcile.py", "the clear-overrides token acted on"),
    "ownedKinds": ("handlers/server/reconcile.py", "the optional kinds this server may own (prune)"),
    "renderedDigest": ("handlers/server/reconcile.py", "the digest of the workload as last rendered"),
    "url": ("handlers/server/reconcile.py", "the engine Service's URL"),
    "workload": ("handlers/server/workloadstatus.py", "the engine workload's kind"),
    "selector": ("handlers/server/workloadstatus.py", "the scale subresource's label selector"),
    "groupSize": ("handlers/server/workloadstatus.py", "pods per engine group (multi-node engines)"),
    "lastCrash": ("handlers/engines/crashwatch.py", "the most recent engine crash classified"),
    "remediations": ("handlers/core/remediation.py", "the remediations claimed, once per signature per revision"),
    "acceptance": ("handlers/engines/acceptance.py", "speculative-decoding acceptance figures"),
    "stall": ("handlers/engines/stall.py", "the stalled engines"),
    "probes": ("handlers/engines/probes.py", "the output probes' results"),
}


def _version(obj: dict[str, Any]) -> int | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else None


def _newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether `a` is a later version of the same object than `b`."""
    if a["metadata"].get("uid") != b["metadata"].get("uid"):
        return False
    va, vb = _version(a), _version(b)
    return va is not None and vb is not None and va > vb


class Servers:
    """(namespace, name) → the newest body seen (without managedFields). Thread-safe: worker threads read it."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        #: servers whose workload the operator itself is rendering and applying now (see `applying`)
        self._applying: collections.Counter[tuple[str, str]] = collections.Counter()

    @contextlib.contextmanager
    def applying(self, namespace: str, name: str) -> Iterator[None]:
        """Mark the operator's own change of this server's workload, from the status write that decides it to the
        end of the apply. A workload event seen meanwhile (the crashed pod's Deployment status, say) shows the old
        workload against the new decision: that is the operator's apply in flight, not drift, and must cost no
        fresh read and no DriftCorrected Event (workload.on_deployment); the apply's own event checks the result."""
        key = (namespace, name)
        with self._lock:
            self._applying[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._applying[key] -= 1
                if self._applying[key] <= 0:
                    del self._applying[key]

    def is_applying(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._applying

    def put(self, obj: dict[str, Any] | None) -> None:
        """Remember `obj` unless the stored body is newer. A deleted object (deletionTimestamp) is kept too:
        readers check for it."""
        if not obj or not obj.get("metadata"):
            return
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta.get("name") or "")
        slim = kube.plain_object(obj)
        with self._lock:
            old = self._bodies.get(key)
            if old is None or not _newer(old, slim):
                self._bodies[key] = slim

    def get(self, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
        """A copy of the newest body seen (None: none seen, or, with `uid`, only one of an earlier object of
        that name)."""
        with self._lock:
            obj = self._bodies.get((namespace, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return None
        copied: dict[str, Any] = kube.plain(obj)
        return copied

    def current(self, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
        """The newest body seen, or (none seen) the object read now (None: it does not exist)."""
        return self.get(namespace, name, uid) or self.read(namespace, name)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the API server holds it now (one GET), remembered (None: it does not exist)."""
        obj = statusguard.get_server(namespace, name)
        self.put(obj)
        return obj

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._bodies.pop((namespace, name), None)

    def update_status(
        self,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any], dict[str, Any]], None],
        obj: dict[str, Any] | None = None,
        retries: int = 8,
    ) -> dict[str, Any] | None:
        """Write status with `mutate(status, obj)` (statusguard.update_status) from the newest of `obj` and the
        body seen last (no read; a read only when there is neither, or the guarded patch finds the status
        moved), remembering what was written. Returns the object written (None: it is gone)."""
        seen = self.get(namespace, name, (obj or {}).get("metadata", {}).get("uid"))
        base = seen if seen is not None and (obj is None or _newer(seen, obj)) else obj
        out = statusguard.update_status(namespace, name, mutate, retries=retries, obj=base)
        if out is not base:
            self.put(out)
        return out
