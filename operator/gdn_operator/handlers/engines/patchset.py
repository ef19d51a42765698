"""Crash watch, the patch-set check: what the gdn-guard plugin reported in the engine log (its start-up line,
found by the log follower) against `spec.image.patches`: condition PatchSetVerified, Degraded while the
image does not carry what the spec declares, an Event on each new mismatch.
"""

from __future__ import annotations

import logging
from typing import Any

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.watch.guardline import GuardLine, check_patch_set

log = logging.getLogger(__name__)


def report_patch_check(servers: Servers, namespace: str, name: str, pod: str, line: GuardLine | None) -> None:
    """Compare what the gdn-guard plugin reported in the engine log with spec.image.patches."""
    events: list[tuple[str, str]] = []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        image = (obj.get("spec") or {}).get("image") or {}
        check = check_patch_set(image.get("patches") or [], line, str(image.get("vllmVersion", "")))
        if line is None and check.ok:
            return  # nothing declared, no plugin: nothing to say
        gen = obj["metadata"].get("generation")
        msg = f"pod {pod}: {check.message}"
        # False degrades the server (conditions.refresh_degraded)
        if st.set_condition(status, st.PATCH_SET, check.ok, check.reason, msg, gen) and not check.ok:
            events.append((check.reason, msg))

    obj = servers.update_status(namespace, name, mutate)
    if obj is not None:
        for reason, msg in events:
            log.warning(
                "patch set of %s/%s generation %s not verified (%s): %s",
                namespace,
                name,
                obj["metadata"].get("generation"),
                reason,
                msg,
            )
            kube.emit_event(obj, reason, msg, "Warning")
