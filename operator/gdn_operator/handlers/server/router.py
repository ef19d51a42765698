"""InferencePool status → GDNModelServer conditions.

The Gateway API Inference Extension controller (the gateway implementation) reports, per parent Gateway,
`Accepted` and `ResolvedRefs` in InferencePool status.parents[].conditions. The operator mirrors them as
`InferencePoolAccepted` / `InferencePoolResolvedRefs` on the server: True when every parent says True,
False (with that parent's reason and message) when one says False, absent until a controller reports.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.servers import Servers

#: InferencePool condition type → the GDNModelServer condition that mirrors it.
MIRRORED = {"Accepted": st.INFERENCE_POOL_ACCEPTED, "ResolvedRefs": st.INFERENCE_POOL_RESOLVED_REFS}


def aggregate(pool: dict[str, Any]) -> dict[str, tuple[bool, str, str]]:
    """{pool condition type: (status, reason, message)} over all parents (only types some parent reports)."""
    out: dict[str, tuple[bool, str, str]] = {}
    for parent in (pool.get("status") or {}).get("parents") or []:
        gw = (parent.get("parentRef") or {}).get("name", "?")
        for c in parent.get("conditions") or []:
            typ = c.get("type")
            if typ not in MIRRORED or c.get("status") not in ("True", "False"):
                continue
            ok = c["status"] == "True"
            prev = out.get(typ)
            if prev is None or (prev[0] and not ok):
                out[typ] = (ok, c.get("reason") or typ, f"gateway {gw}: {c.get('message') or c.get('reason') or typ}")
    return out


def mirror(servers: Servers, namespace: str, name: str, pool: dict[str, Any] | None) -> None:
    agg = aggregate(pool) if pool is not None else {}

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        for typ, ours in MIRRORED.items():
            if typ in agg:
                ok, reason, msg = agg[typ]
                st.set_condition(status, ours, ok, reason, msg, gen)
            elif st.get_condition(status, ours) is not None:
                st.remove_condition(status, ours)

    servers.update_status(namespace, name, mutate)


async def inference_pool_event(
    servers: Servers, type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta, **_: Any
) -> None:
    namespace = kube.require_namespace(namespace)
    name = kube.owner_name(meta)
    if not name:
        return
    await asyncio.to_thread(mirror, servers, namespace, name, None if type == "DELETED" else kube.plain_object(body))
