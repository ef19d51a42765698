"""A GDNGuard's status carries the conditions the guard documents (handlers/guard/status.py GUARD_CONDITIONS, README
"Guard an existing vLLM deployment") and no other: a Stalled finding is condition Stalled, never a GDNModelServer's
Degraded or phase (issue 49: the guard wrote the server's condition writer's Degraded, undocumented). Through the
guard's round: a real AcceptanceSupervisor and StallWatch over an engine that holds requests and produces nothing,
the test's clock (tests/handlers/scripted_engines.py), the guarded StatefulSet and its pod from tests/builders.py fed
as the guard's events, and the guard's status write caught at handlers/guard/client.py (tests/handlers/guard_cluster.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from builders import CLEAN_ARGS, Guard, Workload
from scripted_engines import ROUND, Clock, Engines, frozen

from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines import acceptance as acc
from gdn_operator.handlers.engines.stall import StallWatch
from gdn_operator.handlers.guard.status import FINDING_TYPES, GUARD_CONDITIONS, Finding, WorkloadView, compose
from gdn_operator.handlers.guard.supervisor import GuardSupervisor
from gdn_operator.settings import Settings
from gdn_operator.watch.acceptance import AcceptanceTracker


def _types(conditions: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in conditions]


async def test_a_stalled_guarded_engine_writes_condition_stalled_and_no_degraded(guard_cluster):
    clock = Clock()
    sup = acc.AcceptanceSupervisor(AcceptanceTracker(window=60, clock=clock), Engines(clock, {"chat-0": frozen}), 1, Servers())
    sup.stall = StallWatch(clock)
    coverage = (True, "Scoped", "CREATE and UPDATE of what the selector matches")
    admission = SimpleNamespace(coverage=lambda ns, n: coverage)
    guards = GuardSupervisor(SimpleNamespace(settings=Settings(stream_logs=False), acceptance=sup, guard_admission=admission))
    sts = Workload("chat", "StatefulSet", namespace="ns").uid("sts-uid").labelled({"app": "chat"}).args(*CLEAN_ARGS)
    guard_cluster.hold(sts.obj(), sts.pod("chat-0").uid("p-0").ip("10.0.0.5").ready().obj())
    await guards.on_guard_event("ADDED", Guard("g").select({"app": "chat"}).uid("g-uid").generation(1).obj())
    guard = guards.guards[("ns", "g")]

    for _ in range(20):  # 300 s of rounds: past the guard's stall threshold (GDN_GUARD_STALL_SECONDS, 120 s)
        await guards.round(guard)
        clock.t += ROUND
        written = [status for _, _, status in guard_cluster.status_writes]
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
