"""The autoscaler's scale-up pause: an autoscaled server pauses scale-up while CrashLooping (more replicas
would only multiply the crash) and resumes when the condition clears. The renderer gives the autoscaler
scaleUp.selectPolicy Disabled while CrashLooping is True (render/autoscale.py); here only that object is
re-applied, by the crash watch (a crash) and the quiet period (the crash loop is over).
"""

from __future__ import annotations

import logging
from typing import Any

from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.kube import ApiException
from gdn_operator.handlers.core.plan import Plan, PlanInputs, plan, plan_key
from gdn_operator.render import autoscale

log = logging.getLogger(__name__)


def apply_autoscaler(namespace: str, name: str, inputs: PlanInputs, planned: Plan | None = None) -> str | None:
    """Re-apply only the server's autoscaler (after CrashLooping changed). Returns "paused"/"resumed"
    when the scale-up policy changed, None otherwise. `planned`: the caller's plan of the newest body, used when
    that body is still the newest (no second plan)."""
    body = inputs.servers.current(namespace, name)  # the newest body seen (the crash's or quiet period's write)
    if body is None:
        return None
    p = planned if planned is not None and planned.key == plan_key(body) else plan(body, inputs)
    scaler = next((o for o in p.objects or [] if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")), None)
    if scaler is None:
        return None
    current = kube.get_object(scaler["kind"], namespace, name)
    paused = autoscale.scale_up_paused(scaler)
    was_paused = current is not None and autoscale.scale_up_paused(current)
    if current is not None and paused == was_paused:
        return None
    try:
        kube.apply(scaler)
    except ApiException as e:
        if e.status != 403:
            raise
        log.warning(
            "%s/%s: cannot update the %s (RBAC: enable it in the chart's scaleOut values)", namespace, name, scaler["kind"]
        )
        return None
    word = "paused" if paused else "resumed"
    log.info("%s/%s: scale-up %s (%s)", namespace, name, word, "CrashLooping" if paused else "crash loop over")
    kube.emit_event(
        body,
        "ScaleUpPaused" if paused else "ScaleUpResumed",
        f"{scaler['kind']} scale-up {word}: "
        + ("the engines are crash-looping; more replicas would only multiply the crash" if paused else "the engines run again"),
        "Warning" if paused else "Normal",
    )
    return word


def sync_scale_up(namespace: str, name: str, obj: dict[str, Any], inputs: PlanInputs, planned: Plan | None = None) -> None:
    """After CrashLooping may have changed on `obj`: re-apply its autoscaler if it has one."""
    if not (obj.get("spec") or {}).get("autoscaling"):
        return
    apply_autoscaler(namespace, name, inputs, planned)
