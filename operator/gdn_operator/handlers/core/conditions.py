"""The conditions of a GDNModelServer's status: the condition types, who writes each, and what is derived from them
(the phase, and Degraded), on the neutral conditions-list writer (handlers/core/condition_list.py, which a
GDNGuard's status uses alone). Plain functions over the status dict; the status schema itself is api/status.py.

Every writer of status goes through `set_condition`, so the phase can never disagree with the conditions
(truthful status). `Degraded` has no writer of its own: it is derived from the conditions of the components
that can degrade a server (DEGRADED_SOURCES), recomputed whenever one of them changes, so it reports every
current cause at once and clears only when none is left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gdn_operator.handlers.core.condition_list import get_condition as get_condition  # the server's readers read here
from gdn_operator.handlers.core.condition_list import put_condition

#: Condition types this operator maintains (CONDITIONS below says which module writes each).
VALIDATED = "Validated"
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CRASH_LOOPING = "CrashLooping"
UNSCHEDULABLE = "Unschedulable"
START_FAILED = "StartFailed"
ACCEPTANCE = "AcceptanceHealthy"
METRICS_AVAILABLE = "MetricsAvailable"
OUTPUT_CONSISTENT = "OutputConsistent"
STALLED = "Stalled"
PATCH_SET = "PatchSetVerified"
INFERENCE_POOL_ACCEPTED = "InferencePoolAccepted"
INFERENCE_POOL_RESOLVED_REFS = "InferencePoolResolvedRefs"
OVERRIDDEN = "Overridden"
DISRUPTION_BLOCKED = "DisruptionBlocked"

#: Every condition type: (the module that writes it, what it says). README's condition table lists these.
CONDITIONS: dict[str, tuple[str, str]] = {
    VALIDATED: (
        "handlers/server/reconcile.py",
        "the spec passed admission (reason Admitted, Mitigated, AdmittedWithWarnings) or why not",
    ),
    PROGRESSING: (
        "handlers/server/reconcile.py, handlers/server/workloadstatus.py",
        "a new generation is being applied and rolled out",
    ),
    READY: ("handlers/server/workloadstatus.py", "every engine pod (or group) is ready"),
    UNSCHEDULABLE: ("handlers/server/workload.py", "engine pods cannot be scheduled (InsufficientGPUs)"),
    DISRUPTION_BLOCKED: (
        "handlers/server/disruption.py",
        "True/EvictionBlocked: a node drain waits on engine pods the PodDisruptionBudget keeps (pods, nodes, the way "
        "out); False once none is",
    ),
    START_FAILED: (
        "handlers/server/workload.py",
        "True: engine pods cannot start: ImagePullFailed (the image cannot be pulled) or ModelDownloadFailed (the "
        "download step fails: gated repository, rate limit, full disk; its last words); False/Started once none is",
    ),
    CRASH_LOOPING: (
        "handlers/engines/crashwatch.py, handlers/core/remediation.py, handlers/engines/quiet.py",
        "True: a known crash repeats; False/EngineCrashed: one crash, within the quiet period",
    ),
    PATCH_SET: ("handlers/engines/patchset.py", "the gdn-guard plugin applied the patches spec.image.patches declares"),
    ACCEPTANCE: ("handlers/engines/acceptance.py", "speculative-decoding acceptance is healthy (False: an acceptance finding)"),
    METRICS_AVAILABLE: ("handlers/engines/acceptance.py", "the engines' /metrics could be scraped"),
    OUTPUT_CONSISTENT: ("handlers/engines/probes.py", "output probes answer as expected"),
    STALLED: (
        "handlers/engines/stall.py",
        "True/EngineStalled: an engine holds requests but makes no progress (pods, requests "
        "stuck, seconds without progress); False once none is",
    ),
    INFERENCE_POOL_ACCEPTED: ("handlers/server/router.py", "mirrors the InferencePool's Accepted (all parent gateways)"),
    INFERENCE_POOL_RESOLVED_REFS: ("handlers/server/router.py", "mirrors the InferencePool's ResolvedRefs"),
    OVERRIDDEN: (
        "handlers/server/reconcile.py, handlers/core/remediation.py",
        "True (Overrides): the operator runs values of status.overrides instead of the spec's; False: none",
    ),
    DEGRADED: ("handlers/core/conditions.py (derived)", "one or more causes below hold; reason = the first, message lists all"),
}

#: CrashLooping reasons while a crash is recent (not yet cleared by the quiet period).
CRASH_ACTIVE = ("RepeatedCrash", "Remediated", "EngineCrashed")
#: Stalled reason while an engine is stalled.
STALL_REASON = "EngineStalled"
#: AcceptanceHealthy reasons that degrade a server (the acceptance findings).
ACCEPTANCE_REASONS = ("SpecAcceptanceNearZero", "SpecAcceptanceDrop", "EarlyStopShift")


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
    """Set one condition; lastTransitionTime changes only when the status value changes. A source of
    Degraded (DEGRADED_SOURCES) recomputes it. Returns True when the condition changed."""
    changed = _write(status, type_, value, reason, message, generation)
    if changed and type_ in _SOURCE_TYPES:
        refresh_degraded(status, generation)
    return changed


def _write(status: dict[str, Any], type_: str, value: bool | None, reason: str, message: str, generation: int | None) -> bool:
    """The neutral writer's (condition_list.put_condition), then the phase from the conditions."""
    if not put_condition(status, type_, value, reason, message, generation):
        return False
    status["phase"] = derive_phase(status)
    return True


def _crash(status: dict[str, Any]) -> tuple[str, str] | None:
    c = get_condition(status, CRASH_LOOPING)
    if c and c.get("reason") in CRASH_ACTIVE and (c.get("status") == "True" or c.get("reason") == "EngineCrashed"):
        return "EngineCrashed", c.get("message", "")
    return None


def _when_false(type_: str, reasons: tuple[str, ...] | None = None) -> Callable[[dict[str, Any]], tuple[str, str] | None]:
    def source(status: dict[str, Any]) -> tuple[str, str] | None:
        c = get_condition(status, type_)
        if c and c.get("status") == "False" and (reasons is None or c.get("reason") in reasons):
            return c.get("reason") or type_, c.get("message", "")
        return None

    return source


def _when_true(type_: str) -> Callable[[dict[str, Any]], tuple[str, str] | None]:
    def source(status: dict[str, Any]) -> tuple[str, str] | None:
        c = get_condition(status, type_)
        if c and c.get("status") == "True":
            return c.get("reason") or type_, c.get("message", "")
        return None

    return source


def _partially_ready(status: dict[str, Any]) -> tuple[str, str] | None:
    c = get_condition(status, READY)
    if c and c.get("status") == "False" and c.get("reason") == "EnginesNotReady" and int(status.get("readyReplicas") or 0) > 0:
        return "PartiallyReady", "only " + c.get("message", "")
    return None


#: What degrades a server, by owner, in the order their reasons are reported: (owner, condition read, cause).
DEGRADED_SOURCES: tuple[tuple[str, str, Callable[[dict[str, Any]], tuple[str, str] | None]], ...] = (
    ("crash watch (handlers/engines/crashwatch.py)", CRASH_LOOPING, _crash),
    ("stall detector (handlers/engines/stall.py)", STALLED, _when_true(STALLED)),
    ("pod start (handlers/server/workload.py)", START_FAILED, _when_true(START_FAILED)),
    ("patch-set check (handlers/engines/patchset.py)", PATCH_SET, _when_false(PATCH_SET)),
    ("output probes (handlers/engines/probes.py)", OUTPUT_CONSISTENT, _when_false(OUTPUT_CONSISTENT)),
    ("acceptance (handlers/engines/acceptance.py)", ACCEPTANCE, _when_false(ACCEPTANCE, ACCEPTANCE_REASONS)),
    ("workload (handlers/server/workloadstatus.py)", READY, _partially_ready),
)
_SOURCE_TYPES = {t for _, t, _ in DEGRADED_SOURCES}


def crash_recent(status: dict[str, Any]) -> bool:
    """A crash the quiet period has not cleared yet (CrashLooping True, or False with reason EngineCrashed)."""
    return _crash(status) is not None


def degraded_causes(status: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of every current cause of Degraded, in DEGRADED_SOURCES order."""
    return [cause for _, _, source in DEGRADED_SOURCES if (cause := source(status)) is not None]


def refresh_degraded(status: dict[str, Any], generation: int | None = None) -> bool:
    """The one writer of Degraded: True while any source reports a cause (reason: the first; message: all of
    them), False once none is left. Never created just to say False. Returns True when it changed."""
    causes = degraded_causes(status)
    current = get_condition(status, DEGRADED)
    if not causes:
        if current is None or current.get("status") != "True":
            return False
        return _write(status, DEGRADED, False, "Recovered", f"{current.get('reason')} cleared", generation)
    reason, message = causes[0]
    if len(causes) > 1:
        message += " (also: " + "; ".join(f"{r}: {m}" for r, m in causes[1:]) + ")"
    return _write(status, DEGRADED, True, reason, message, generation)


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


def set_replicas(status: dict[str, Any], desired: int, ready: int, generation: int | None = None) -> None:
    status["replicas"] = desired
    status["readyReplicas"] = ready
    status["ready"] = f"{ready}/{desired}"
    refresh_degraded(status, generation)  # PartiallyReady reads readyReplicas
    status["phase"] = derive_phase(status)


def remove_condition(status: dict[str, Any], type_: str) -> None:
    """Drop a condition (a mirrored one whose source is gone)."""
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != type_]
    if type_ in _SOURCE_TYPES:
        refresh_degraded(status)
    status["phase"] = derive_phase(status)


def set_overridden(status: dict[str, Any], generation: int | None = None) -> bool:
    """Overridden from status.overrides: True with each path=value (reason), False (NoOverrides) when none."""
    items = status.get("overrides") or []
    if not items:
        return set_condition(
            status, OVERRIDDEN, False, "NoOverrides", "The engine runs the spec as written (and its safe defaults).", generation
        )
    listed = ", ".join(f"{o.get('path')}={o.get('value')!r} ({o.get('reason')})" for o in items)
    return set_condition(
        status,
        OVERRIDDEN,
        True,
        "Overrides",
        f"{len(items)} operator override(s) in force, the spec is unchanged: {listed}",
        generation,
    )
