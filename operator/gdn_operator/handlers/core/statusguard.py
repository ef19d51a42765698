"""The status-write guard and the one read of a GDNModelServer: what handlers/core/servers.py is built on, and
nothing else may import (the forbidden contract in pyproject.toml: every read of a server and every write of
its status goes through servers.Servers, which keeps the newest body).

A status write is one JSON patch (RFC 6902) of the keys that changed, guarded by `test` operations on what it
was computed from (status_patch); a failed guard reads the object again and recomputes (update_status).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers.core import kube

log = logging.getLogger(__name__)


def get_server(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        # custom objects come back as the decoded JSON dict (the client annotates them as `object`)
        return cast(
            dict[str, Any],
            kubernetes.client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            ),
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise


#: Status keys other status keys are derived from: a write that changes the phase or a condition also
#: requires these to be as it read them (conditions.derive_phase / refresh_degraded read them).
_DERIVED_FROM = ("conditions", "readyReplicas")


def status_patch(old: dict[str, Any] | None, new: dict[str, Any], resource_version: str) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that turns status `old` into `new`, guarded by `test` operations.

    Only the keys that changed are written, so writers of different keys need not conflict (kopf's own
    annotation patches, the workload's replica counts, the acceptance figures). Each changed key, and what the
    phase derives from when a condition changes, must still hold the value this write was computed from
    (a concurrent change of the same key fails the patch instead of being overwritten). The whole object's
    resourceVersion is the precondition instead when a guarded key is absent (JSON patch cannot test for
    absence) or holds a value kube-apiserver would not compare equal (`_comparable`)."""
    by_version = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
    if not old:
        return by_version + [{"op": "add", "path": "/status", "value": new}]
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k, _ABSENT) != new.get(k, _ABSENT)]
    guarded = set(changed)
    if guarded & {"conditions", "phase"}:
        guarded.update(k for k in _DERIVED_FROM if k in old)
    tests: list[dict[str, Any]] = []
    for k in sorted(guarded):
        if k not in old or not _comparable(old[k]):
            tests = by_version
            break
        tests.append({"op": "test", "path": _pointer(k), "value": old[k]})
    writes = [
        {"op": "add", "path": _pointer(k), "value": new[k]} if k in new else {"op": "remove", "path": _pointer(k)}
        for k in changed
    ]
    return tests + writes


def _comparable(value: Any) -> bool:
    """Whether kube-apiserver's JSON patch `test` finds this value equal to itself as stored. It compares
    strings and numbers by their JSON text (evanphx/json-patch, compacted), and it writes the stored object
    with Go's encoder: non-ASCII raw, <, > and & escaped, floats in Go's format. Plain ASCII strings,
    integers, booleans and null read the same either way."""
    if isinstance(value, dict):
        return all(_comparable(v) for v in value.values())
    if isinstance(value, list):
        return all(_comparable(v) for v in value)
    if isinstance(value, str):
        return all(" " <= c <= "~" and c not in "<>&" for c in value)
    return value is None or isinstance(value, (bool, int))


_ABSENT = object()


def _pointer(key: str) -> str:
    return "/status/" + key.replace("~", "~0").replace("/", "~1")


def _holds(ops: list[dict[str, Any]], obj: dict[str, Any]) -> bool:
    """Whether every `test` of a JSON patch holds on `obj`. kube-apiserver answers a failed `test` with a bare
    422 Invalid, like a status its schema refuses: a patch whose tests still hold was refused for what it
    writes, not for a concurrent change."""
    for op in ops:
        if op["op"] != "test":
            continue
        node: Any = obj
        for part in op["path"].strip("/").split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        if node != op["value"]:
            return False
    return True


def update_status(
    namespace: str,
    name: str,
    mutate: Callable[[dict[str, Any], dict[str, Any]], None],
    retries: int = 8,
    obj: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Read-modify-write of .status as one guarded JSON patch of the changed keys (status_patch).

    `mutate(status, obj)` edits the status dict in place. With `obj` (the body an event delivered) nothing is
    read: one request per write. Only when the status changed meanwhile (a precondition failed) is the
    object read again and `mutate` re-run; from the third attempt on, the whole object's resourceVersion is
    the precondition. Returns the updated object, or None when the object is gone.
    """
    api = kubernetes.client.CustomObjectsApi(kube.api_client())
    read = {"obj": obj}

    def write(attempt: int) -> dict[str, Any] | None:
        obj = read["obj"] if read["obj"] is not None else get_server(namespace, name)
        if obj is None:
            return None
        old = obj.get("status") or {}
        status = kube.plain(old)
        conditions_before = _condition_states(status)
        mutate(status, obj)
        if status == old:
            return obj
        rv = obj["metadata"]["resourceVersion"]
        ops = status_patch(old, status, rv)
        if attempt >= 2:
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] + [o for o in ops if o["op"] != "test"]
        try:
            out = kube._json(
                api.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    ops,
                    field_manager=kube.FIELD_MANAGER,
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                )
            )
            _log_status_written(namespace, name, obj["metadata"].get("generation"), conditions_before, status)
            return out
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status not in (409, 422) or attempt + 1 >= retries:
                raise
            fresh = get_server(namespace, name)
            if fresh is None:
                return None
            if e.status == 422 and _holds(ops, fresh):
                # refused for what it writes (the CRD's schema), not because the status moved
                log.warning("status patch of %s/%s refused: %s; patch: %s", namespace, name, e.body, json.dumps(ops)[:4000])
                raise
            log.debug("status of %s/%s changed since read (attempt %d): read again", namespace, name, attempt + 1)
            read["obj"] = fresh
            raise kube.Retry(e) from e

    return kube.retrying(write, retries)


def _condition_states(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c.get("type", ""): (c.get("status", ""), c.get("reason", "")) for c in status.get("conditions") or []}


def _log_status_written(
    namespace: str, name: str, generation: Any, before: dict[str, tuple[str, str]], status: dict[str, Any]
) -> None:
    """One INFO line per status write that changes a condition (what changed); figures-only writes at DEBUG."""
    after = _condition_states(status)
    changes = [f"{t}={s} ({r})" for t, (s, r) in after.items() if before.get(t) != (s, r)]
    changes += [f"{t} removed" for t in before if t not in after]
    if changes:
        log.info(
            "status written %s/%s generation %s: phase %s; %s",
            namespace,
            name,
            generation,
            status.get("phase"),
            ", ".join(changes),
        )
    else:
        log.debug("status written %s/%s generation %s (no condition changed)", namespace, name, generation)
