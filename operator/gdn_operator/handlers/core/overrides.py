"""Put an operator-owned override into effect now (api/overrides.py says what an override is).

A remediation records its change in status.overrides instead of the spec, so no spec change (and no kopf
update handler) follows it: the crash watch and the output probes call `reapply` to render the server
again — overrides applied — and apply what changed (server-side apply; an unchanged object writes nothing).
"""

from __future__ import annotations

import logging

from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.plan import Plan, PlanInputs, plan

log = logging.getLogger(__name__)


def reapply(namespace: str, name: str, inputs: PlanInputs) -> Plan | None:
    """Render `namespace/name` with its overrides and apply its objects. Returns the plan applied (None: the
    server is gone or nothing can be applied), which the caller passes on (autoscaler.sync_scale_up)."""
    body = inputs.servers.current(namespace, name)  # the newest body seen: the override's own status write
    if body is None:
        return None
    p = plan(body, inputs)
    if p.objects is None:
        log.warning("override not applied to %s/%s: %s", namespace, name, p.problem[:300])
        return None
    changed = False
    for obj in p.objects:
        _out, obj_changed = kube.apply_changed(obj)
        changed = changed or (obj_changed and obj["kind"] in ("Deployment", "LeaderWorkerSet"))
    # the decision (an override added) is logged at INFO where it is made (remediation.remediate_once)
    log.debug(
        "applied overrides to %s/%s (workload changed: %s): %s",
        namespace,
        name,
        changed,
        ", ".join(f"{o.get('path')}={o.get('value')!r} ({o.get('reason')})" for o in p.overrides) or "none in force",
    )
    return p
