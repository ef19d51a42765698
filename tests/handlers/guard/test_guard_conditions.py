"""A GDNGuard's status carries the conditions the guard documents (handlers/guard/status.py GUARD_CONDITIONS, README
"Guard an existing vLLM deployment") and no other: a Stalled finding is condition Stalled, never a GDNModelServer's
Degraded or phase (issue 49: the guard wrote the server's condition writer's Degraded, undocumented). Through the
guard's round: a real AcceptanceSupervisor and StallWatch over an engine that holds requests and produces nothing,
the test's clock, and the guard's status write caught at handlers/guard/client.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from builders import EnginePod

from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.handlers.core.pods import pod_summary
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines import acceptance as acc
from gdn_operator.handlers.engines.stall import StallWatch
from gdn_operator.handlers.guard import client
from gdn_operator.handlers.guard.owners import WorkloadRef
from gdn_operator.handlers.guard.status import FINDING_TYPES, GUARD_CONDITIONS, Finding, WorkloadView, compose
from gdn_operator.handlers.guard.supervisor import GuardedPod, GuardState, GuardSupervisor, WorkloadState
from gdn_operator.settings import Settings
from gdn_operator.watch.acceptance import AcceptanceTracker, EngineSnapshot
from gdn_operator.watch.scraper import ScrapeResult


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def frozen(t: float) -> EngineSnapshot:
    """An engine holding 8 requests and producing nothing (the G1 stall): its counters stand still."""
    return EngineSnapshot(
        timestamp=t,
        num_drafts=5000.0,
        num_draft_tokens=15000.0,
        num_accepted_tokens=3000.0,
        generation_tokens=40000.0,
        prompt_tokens=130000.0,
        num_requests_running=8,
        num_requests_waiting=0,
        engines=1,
        start_time=900.0,
    )


class Engines:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def scrape(self, targets: list[Any]) -> list[ScrapeResult]:
        return [ScrapeResult(t, frozen(self.clock.t)) for t in targets]

    async def close(self) -> None:
        pass


def _types(conditions: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in conditions]


async def test_a_stalled_guarded_engine_writes_condition_stalled_and_no_degraded(monkeypatch):
    clock = Clock()
    sup = acc.AcceptanceSupervisor(AcceptanceTracker(window=60, clock=clock), Engines(clock), 1, Servers())
    sup.stall = StallWatch(clock)
    coverage = (True, "Scoped", "CREATE and UPDATE of what the selector matches")
    rt = SimpleNamespace(settings=Settings(), acceptance=sup, guard_admission=SimpleNamespace(coverage=lambda ns, n: coverage))
    guards = GuardSupervisor(rt)
    written: list[dict[str, Any]] = []
    monkeypatch.setattr(client, "write_status", lambda ns, name, status: written.append(status) or True)
    monkeypatch.setattr(client, "emit_event", lambda *a, **kw: None)
    monkeypatch.setattr(client, "apply_policy_report", lambda report: True)
    spec = GDNGuardSpec.model_validate({"selector": {"matchLabels": {"app": "chat"}}})
    guard = guards.guards[("ns", "g")] = GuardState("ns", "g", uid="g-uid", generation=1, spec=spec)
    summary = pod_summary(EnginePod("chat-0").uid("p-0").labels({"app": "chat"}).ip("10.0.0.5").ready().obj(), "vllm")
    gp = GuardedPod("chat-0", "p-0", "vllm", 8000, ("vllm", "serve", "m"), "0.34.0", "imageTag", None, summary)
    ref = WorkloadRef("StatefulSet", "chat", "apps/v1", "sts-uid")
    guard.workloads[("StatefulSet", "chat")] = WorkloadState(ref, pods={"chat-0": gp})

    for _ in range(20):  # 300 s of rounds: past the guard's stall threshold (GDN_GUARD_STALL_SECONDS, 120 s)
        await guards.round(guard)
        clock.t += 15.0
        if written and "Stalled" in _types(written[-1]["conditions"]):
            break
    status = written[-1]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Stalled"]["status"] == "True" and conds["Stalled"]["reason"] == "Stalled"
    assert "chat-0: 8 requests running" in conds["Stalled"]["message"]
    assert "Degraded" not in conds and "phase" not in status
    assert set(conds) == {"Ready", "Admission", "Stalled"} and set(conds) <= set(GUARD_CONDITIONS)
    (w,) = status["workloads"]
    assert _types(w["conditions"]) == ["Stalled"] and [f["type"] for f in w["findings"]] == ["Stalled"]


def test_conditions_an_older_operator_wrote_are_dropped():
    """A guard status written before (with the server's writer: Degraded beside Stalled, a phase) keeps only the
    documented conditions, their times kept."""
    since = "2026-01-01T00:00:00Z"
    stalled = {"type": "Stalled", "status": "True", "reason": "Stalled", "message": "p: stuck", "lastTransitionTime": since}
    degraded = {"type": "Degraded", "status": "True", "reason": "Stalled", "message": "p: stuck", "lastTransitionTime": since}
    prev = {
        "phase": "Degraded",
        "conditions": [stalled, degraded],
        "workloads": [{"kind": "Deployment", "name": "d", "conditions": [stalled, degraded]}],
    }
    finding = Finding("Stalled", "stuck", since, "engine-stall", "p")
    status = compose(prev, [WorkloadView("Deployment", "d", "0.34.0", "imageTag", 1, [finding])], 1, [])
    assert _types(status["conditions"]) == ["Stalled", "Ready", "Admission"] and "phase" not in status
    assert status["conditions"][0]["lastTransitionTime"] == since
    (w,) = status["workloads"]
    assert _types(w["conditions"]) == ["Stalled"] and w["conditions"][0]["lastTransitionTime"] == since
    assert set(GUARD_CONDITIONS) == {"Ready", "Admission", *FINDING_TYPES}
