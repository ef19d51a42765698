"""The newest GDNModelServer bodies the operator has seen: what its Deployment events and acceptance rounds read
instead of asking the API server (issue 29 part 9: a GET per Deployment event and per acceptance write was a
third of the operator's requests per server in bench/bench_reconcile.py).

Fed by every GDNModelServer watch event (handlers/main.py, track_servers) and by the operator's own status
writes (the object each patch returns), so a Deployment event that arrives before the watch delivers the
reconcile's status write still sees that write. Of two bodies the one with the higher resourceVersion is
kept (etcd's revision; a version that is not a number replaces the stored one).

A body from here may be stale (a write by someone else not delivered yet). That costs a request, never a
wrong write: status writes are JSON patches guarded by what they were computed from (kube.status_patch), so
a stale body fails its `test` and kube.update_status reads the object again.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from gdn_operator.handlers import kube


def _version(obj: dict[str, Any]) -> int | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else None


def _newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether `a` is a later version of the same object than `b`."""
    if a["metadata"].get("uid") != b["metadata"].get("uid"):
        return False
    va, vb = _version(a), _version(b)
    return va is not None and vb is not None and va > vb


class ServerBodies:
    """(namespace, name) → the newest body seen (without managedFields). Thread-safe: worker threads read it."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def put(self, obj: dict[str, Any] | None) -> None:
        """Remember `obj` unless the stored body is newer. A deleted object (deletionTimestamp) is kept too:
        readers check for it."""
        if not obj or not obj.get("metadata"):
            return
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta.get("name") or "")
        slim = copy.deepcopy({**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}})
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
        return copy.deepcopy(obj)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._bodies.pop((namespace, name), None)

    def update_status(
        self,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any], dict[str, Any]], None],
        obj: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """kube.update_status from the newest of `obj` and the body seen last (no read; a read only when there
        is neither, or the guarded patch finds the status moved), remembering what was written."""
        seen = self.get(namespace, name, (obj or {}).get("metadata", {}).get("uid"))
        base = seen if seen is not None and (obj is None or _newer(seen, obj)) else obj
        out = kube.update_status(namespace, name, mutate, obj=base)
        if out is not base:
            self.put(out)
        return out
