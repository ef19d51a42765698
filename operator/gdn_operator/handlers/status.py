"""Pure status logic: conditions with transition times, and the phase derived from them.

Every writer of status goes through `set_condition` and `derive_phase`, so the phase can never
disagree with the conditions (truthful status).
"""

from __future__ import annotations

from typing import Any

from gdn_operator.handlers.kube import now
from gdn_operator.redact import redact

#: Condition types this operator maintains (CONDITIONS below says which module writes each).
VALIDATED = "Validated"
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CRASH_LOOPING = "CrashLooping"
UNSCHEDULABLE = "Unschedulable"
ACCEPTANCE = "AcceptanceHealthy"
METRICS_AVAILABLE = "MetricsAvailable"
OUTPUT_CONSISTENT = "OutputConsistent"
PATCH_SET = "PatchSetVerified"
INFERENCE_POOL_ACCEPTED = "InferencePoolAccepted"
INFERENCE_POOL_RESOLVED_REFS = "InferencePoolResolvedRefs"


def get_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(status: dict[str, Any], type_: str) -> bool:
    c = get_condition(status, type_)
    return bool(c and c.get("status") == "True")


def set_condition(
    status: dict[str, Any],
    type_: str,
    value: bool | None,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> bool:
    """Set one condition; lastTransitionTime changes only when the status value changes.
    Returns True when anything changed."""
    st = "Unknown" if value is None else ("True" if value else "False")
    message = redact(message)  # condition messages quote engine output and API errors
    conds = list(status.get("conditions") or [])
    for i, c in enumerate(conds):
        if c.get("type") == type_:
            new = dict(c)
            if c.get("status") != st:
                new["lastTransitionTime"] = now()
            new.update(status=st, reason=reason, message=message[:2048])
            if generation is not None:
                new["observedGeneration"] = generation
            if new == c:
                return False
            conds[i] = new
            status["conditions"] = conds
            status["phase"] = derive_phase(status)
            return True
    new = {"type": type_, "status": st, "reason": reason, "message": message[:2048], "lastTransitionTime": now()}
    if generation is not None:
        new["observedGeneration"] = generation
    conds.append(new)
    status["conditions"] = conds
    status["phase"] = derive_phase(status)
    return True


def derive_phase(status: dict[str, Any]) -> str:
    v = get_condition(status, VALIDATED)
    if v is not None and v.get("status") == "False" and not status.get("readyReplicas"):
        return "Rejected"
    if is_true(status, CRASH_LOOPING):
        return "CrashLooping"
    if is_true(status, UNSCHEDULABLE):
        return "Unschedulable"
    if is_true(status, READY):
        return "Degraded" if is_true(status, DEGRADED) else "Ready"
    if is_true(status, DEGRADED):
        return "Degraded"
    if v is None:
        return "Pending"
    return "Progressing"


def set_replicas(status: dict[str, Any], desired: int, ready: int) -> None:
    status["replicas"] = desired
    status["readyReplicas"] = ready
    status["ready"] = f"{ready}/{desired}"
    status["phase"] = derive_phase(status)
