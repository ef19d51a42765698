"""A GDNGuard's findings and where they are shown: the guard's status (one merge patch of the status subresource
per round, only when it changed), and a PolicyReport (wgpolicyk8s.io/v1alpha2, the CRD Kyverno and the Trivy
operator use) per namespace where that CRD is installed, so existing policy UIs list them.

A finding is one thing wrong with a guarded workload: KnownCrash (a known-issue rule on its launch line),
CrashDiagnosed (an engine death the crash watch classified), Stalled, AcceptanceCollapsed, OutputInconsistent.
Its `since` is when it was first seen, kept while it holds, so an unchanged finding rewrites nothing.

Pure: what to write. The writes (the guard's own status subresource, and the PolicyReports the operator owns,
server-side applied with its field manager) are handlers/guard/client.py's; neither touches an object that is not
the operator's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

from gdn_operator.api.guard import FindingType
from gdn_operator.handlers.core.condition_list import get_condition, put_condition
from gdn_operator.handlers.guard import client
from gdn_operator.redact import redact

FINDING_TYPES: tuple[str, ...] = get_args(FindingType)
#: the one PolicyReport per namespace the operator owns
POLICY_REPORT = "gdn-guard"
READY, ADMISSION = "Ready", "Admission"
#: Every condition of a GDNGuard's status, and what it says (README, "Guard an existing vLLM deployment"): a
#: guard's own, not a GDNModelServer's (no Degraded, no phase). Each guarded workload (status.workloads[]) has the
#: finding types' conditions of its own findings.
GUARD_CONDITIONS: dict[str, str] = {
    READY: "True/Guarding: the workloads and engine pods it guards; False/GuardInvalid: its spec's problems",
    ADMISSION: "True/Scoped: what its admission webhook covers; False (AdmissionOff, NamespaceExcluded, "
    "ConfigurationFull): why it covers nothing (docs/guard-admission.md)",
    **{t: f"True/{t} while a {t} finding holds (messages of up to four); False/NoFinding once none is" for t in FINDING_TYPES},
}
_SEVERITY = {
    "KnownCrash": "high",
    "CrashDiagnosed": "high",
    "Stalled": "high",
    "AcceptanceCollapsed": "medium",
}  # the CRD: high, medium, low


@dataclass
class Finding:
    """One finding. Its message is redacted when it is made (redact.redact, the function every path that copies
    engine output uses): status, PolicyReports, Events and log lines all take it from here."""

    type: str
    message: str
    since: str
    rule: str | None = None
    pod: str | None = None
    count: int | None = None

    def __post_init__(self) -> None:
        self.message = redact(self.message)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.type, self.rule or "", self.pod or "")

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "rule": self.rule,
            "pod": self.pod,
            "message": self.message[:1024],
            "since": self.since,
        }
        if self.count is not None:
            out["count"] = self.count
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class WorkloadView:
    """What status says of one guarded workload."""

    kind: str
    name: str
    version: str | None
    version_source: str
    pods: int
    findings: list[Finding] = field(default_factory=list)
    acceptance: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def _kept(prev: list[dict[str, Any]], types: Iterable[str]) -> dict[str, Any]:
    """The conditions last written, of the types a guard documents only (a condition an older operator wrote, such
    as Degraded, is dropped), as a status-like holder for the writer."""
    keep = set(types)
    return {"conditions": [copy.deepcopy(c) for c in prev if c.get("type") in keep]}


def _conditions(holder: dict[str, Any], findings: list[Finding], generation: int | None) -> list[dict[str, Any]]:
    """Set one condition per finding type in `holder` (True while a finding of it holds; False/NoFinding once none
    is, never created just to say False) through the neutral writer (lastTransitionTime moves only on a change);
    its conditions."""
    for t in FINDING_TYPES:
        hits = [f for f in findings if f.type == t]
        if hits:
            msg = "; ".join(f"{f.pod + ': ' if f.pod else ''}{f.message}" for f in hits[:4])
            put_condition(holder, t, True, t, msg, generation)
        elif get_condition(holder, t) is not None:
            put_condition(holder, t, False, "NoFinding", f"no {t} finding", generation)
    return list(holder.get("conditions") or [])


def compose(
    prev: dict[str, Any],
    views: list[WorkloadView],
    generation: int | None,
    problems: list[str],
    admission: tuple[bool, str, str] | None = None,
) -> dict[str, Any]:
    """The guard's status from its workloads (`prev`: the status last written, for the conditions' times), and
    condition Admission: what the guard's admission covers (`admission`: in force, reason, message), False with
    reason AdmissionOff when the feature is off."""
    prev_workloads = {(w.get("kind"), w.get("name")): w for w in prev.get("workloads") or []}
    workloads = []
    all_findings: list[Finding] = []
    for v in sorted(views, key=lambda v: (v.kind, v.name)):
        before = prev_workloads.get((v.kind, v.name)) or {}
        entry: dict[str, Any] = {
            "kind": v.kind,
            "name": v.name,
            "vllmVersion": v.version,
            "versionSource": v.version_source,
            "pods": v.pods,
            "findings": [f.to_status() for f in v.findings[:32]],
            "conditions": _conditions(_kept(before.get("conditions") or [], FINDING_TYPES), v.findings, generation),
            "acceptance": v.acceptance,
            "problems": [redact(p) for p in v.problems[:8]] or None,  # a launch line not read is quoted
        }
        workloads.append({k: x for k, x in entry.items() if x is not None})
        all_findings += v.findings
    status: dict[str, Any] = {"observedGeneration": generation, **_kept(prev.get("conditions") or [], GUARD_CONDITIONS)}
    pods = sum(v.pods for v in views)
    if problems:
        put_condition(status, READY, False, "GuardInvalid", "; ".join(problems), generation)
    else:
        put_condition(status, READY, True, "Guarding", f"{len(views)} workload(s), {pods} engine pod(s) guarded", generation)
    if not problems:
        in_force, reason, message = admission or (False, "AdmissionOff", "spec.features.admission is false")
        put_condition(status, ADMISSION, in_force, reason, message, generation)
    _conditions(status, all_findings, generation)
    status["workloads"] = workloads[:256]
    return status


def fingerprint(status: dict[str, Any]) -> str:
    """What a write would change: the status without the acceptance figures' own timestamp."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "updated"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return json.dumps(strip(status), sort_keys=True, default=str)


# ----------------------------------------------------------------------------------------- PolicyReport ---


def policy_report(namespace: str, results: list[tuple[str, dict[str, Any], Finding]], epoch: float) -> dict[str, Any]:
    """The namespace's PolicyReport: one result per finding (guard, workload object, finding)."""
    out = []
    for guard, target, f in results[:1000]:
        meta = target["metadata"]
        res: dict[str, Any] = {
            "policy": f"gdn-guard/{guard}",
            "rule": f.rule or f.type,
            "category": f.type,
            "result": "fail",
            "severity": _SEVERITY.get(f.type, "high"),
            "message": (f"{f.pod}: " if f.pod else "") + f.message[:900],
            "source": "gdn-operator",
            "scored": True,
            "timestamp": {"seconds": int(epoch), "nanos": 0},
            "resources": [
                {
                    k: v
                    for k, v in {
                        "apiVersion": target["apiVersion"],
                        "kind": target["kind"],
                        "name": meta["name"],
                        "namespace": namespace,
                        "uid": meta.get("uid"),
                    }.items()
                    if v
                }
            ],
        }
        out.append(res)
    return {
        "apiVersion": f"{client.POLICY_GROUP}/{client.POLICY_VERSION}",
        "kind": "PolicyReport",
        "metadata": {"name": POLICY_REPORT, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "gdn-operator"}},
        "scope": None,
        "summary": {"pass": 0, "fail": len(out), "warn": 0, "error": 0, "skip": 0},
        "results": out,
    }
