"""A status's conditions list (metav1.Condition: type, status, reason, message, lastTransitionTime, observedGeneration):
read one by type, set one. Neutral: nothing here knows whose status holds the list or what its conditions mean.
A GDNModelServer's condition table and what it derives (its phase, Degraded) are handlers/core/conditions.py's, on
this writer; a GDNGuard's conditions are handlers/guard/status.py's, on this writer alone.
"""

from __future__ import annotations

from typing import Any

from gdn_operator.handlers.core.kube import now
from gdn_operator.redact import redact

#: the longest condition message kept (the rest is cut)
MAX_MESSAGE = 2048


def get_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The condition of `type_` in `status["conditions"]`, None when there is none."""
    conditions: list[dict[str, Any]] = status.get("conditions") or []
    for c in conditions:
        if c.get("type") == type_:
            return c
    return None


def put_condition(
    status: dict[str, Any],
    type_: str,
    value: bool | None,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> bool:
    """Set one condition of `status["conditions"]` (a new list and a new entry: what the caller held before is not
    changed): True, False or Unknown (None). lastTransitionTime moves only when the status value changes; the
    message is redacted (condition messages quote engine output and API errors). Returns True when it changed."""
    st = "Unknown" if value is None else ("True" if value else "False")
    message = redact(message)[:MAX_MESSAGE]
    conds = list(status.get("conditions") or [])
    for i, c in enumerate(conds):
        if c.get("type") == type_:
            new = dict(c)
            if c.get("status") != st:
                new["lastTransitionTime"] = now()
            new.update(status=st, reason=reason, message=message)
            if generation is not None:
                new["observedGeneration"] = generation
            if new == c:
                return False
            conds[i] = new
            status["conditions"] = conds
            return True
    new = {"type": type_, "status": st, "reason": reason, "message": message, "lastTransitionTime": now()}
    if generation is not None:
        new["observedGeneration"] = generation
    conds.append(new)
    status["conditions"] = conds
    return True
