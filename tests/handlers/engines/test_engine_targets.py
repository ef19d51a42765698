"""One key per watched engine (issue 49 item 3): the per-engine state the run-time watch keeps (acceptance windows,
stall detectors, output-probe state, the gauges holding one value per target) belongs to a (kind, namespace, name)
target, so a GDNModelServer and a guarded StatefulSet of one name in one namespace, or a guarded Deployment and a
guarded StatefulSet of one name, never share or overwrite it.

Real AcceptanceSupervisor, AcceptanceTracker, StallWatch and GuardSupervisor (its workloads built from the guard's
and the pods' events, the owner chain read from a fake cluster: tests/handlers/guard_cluster.py); the engines are a
scripted metrics source (one snapshot per pod per round) and the clock is the test's. Before the key carried the kind, each
target's round forgot the other's pods: the server never got past WarmingUp and the frozen pod never counted
as stalled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gdn_operator import telemetry
from gdn_operator.handlers.engines import acceptance as acc
from gdn_operator.handlers.guard.supervisor import GuardSupervisor, WorkloadState
from gdn_operator.handlers.core.pods import api_pods, pod_summary
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines.stall import StallWatch
from gdn_operator.settings import Settings
from gdn_operator.watch.acceptance import AcceptanceTracker

from builders import EnginePod, Guard, Workload
from scripted_engines import ROUND, ROUNDS, Clock, Engines, frozen, healthy


@pytest.fixture
def writes(monkeypatch):
    """The server's status writes (acceptance and stall blocks) as the round hands them over."""
    calls: list[dict[str, Any]] = []

    def write(namespace, name, acceptance, targets, failed, stall=None, bodies=None):
        calls.append({"server": (namespace, name), "acceptance": acceptance, "stall": stall})
        return [], None

    monkeypatch.setattr(acc, "write_acceptance", write)
    return calls


#: a guard selecting app=chat, and two workloads of one name it selects, as their users write them
GUARD = Guard("g").select({"app": "chat"}).uid("g-uid").generation(1)
STS = Workload("chat", "StatefulSet", namespace="ns").uid("StatefulSet-uid").labelled({"app": "chat"})
DEPLOYMENT = Workload("chat", namespace="ns").uid("Deployment-uid").labelled({"app": "chat"})


def _supervisors(clock: Clock, behaviour: dict[str, Any]) -> tuple[acc.AcceptanceSupervisor, GuardSupervisor]:
    sup = acc.AcceptanceSupervisor(AcceptanceTracker(window=60, clock=clock), Engines(clock, behaviour), 1, Servers())
    sup.stall = StallWatch(clock)
    guards = GuardSupervisor(SimpleNamespace(settings=Settings(stream_logs=False), acceptance=sup))  # engines scripted
    return sup, guards


def _ready(w: Workload, pod: str, uid: str, ip: str) -> dict[str, Any]:
    return w.pod(pod).uid(uid).ip(ip).ready().obj()


def _stalled(ws: WorkloadState) -> list[str]:
    return [f.pod or "" for f in ws.measured if f.type == "Stalled"]


async def test_a_server_and_a_guarded_statefulset_of_one_name_keep_their_own_windows_and_detectors(writes, guard_cluster):
    clock = Clock()
    server_pod = "chat-7d9f5b-x2x4q"
    sup, guards = _supervisors(clock, {server_pod: healthy, "chat-0": frozen})
    pods = api_pods([pod_summary(EnginePod(server_pod).uid("s-0").server("chat").ip("10.0.0.4").ready().obj())])
    guard_cluster.hold(STS.obj(), _ready(STS, "chat-0", "g-0", "10.0.0.5"))
    await guards.on_guard_event("ADDED", GUARD.obj())  # the guard lists the pods it selects: the StatefulSet's
    guard = guards.guards[("ns", "g")]
    sts = guard.workloads[("StatefulSet", "chat")]
    for _ in range(ROUNDS):
        await sup.scrape_round("ns", "chat", pods)  # the GDNModelServer chat
        await guards._measure(guard, sts)  # the StatefulSet chat the guard watches, same namespace
        clock.t += ROUND
    last = writes[-1]["acceptance"]
    # the server's window holds its own pod's rounds: Ok at its own rate, its own pod only, nothing stalled
    assert last["state"] == "Ok", last
    assert last["rate"] == pytest.approx(0.6)
    assert [p["pod"] for p in last["pods"]] == [server_pod]
    assert writes[-1]["stall"] is None
    # the guarded StatefulSet's frozen pod is stalled, and its acceptance is its own (no draft traffic)
    assert _stalled(sts) == ["chat-0"], sts.measured
    assert sts.acceptance is not None and sts.acceptance["state"] == "NoTraffic", sts.acceptance
    assert sts.acceptance["podsReporting"] == 1
    # the gauges that hold one value per target carry its kind: one series each, and forgetting one keeps the other
    reg = telemetry.METRICS_REGISTRY
    server_series = {"namespace": "ns", "server": "chat", "kind": "GDNModelServer"}
    sts_anomaly = {"namespace": "ns", "server": "chat", "kind": "StatefulSet", "reason": "SpecAcceptanceNearZero"}
    assert reg.get_sample_value("gdn_spec_acceptance_rate", server_series) == pytest.approx(0.6)
    assert reg.get_sample_value("gdn_spec_anomaly", sts_anomaly) == 0.0
    guards._forget_workload(guard, sts)  # the StatefulSet is no longer guarded
    assert reg.get_sample_value("gdn_spec_anomaly", sts_anomaly) is None
    assert reg.get_sample_value("gdn_spec_acceptance_rate", server_series) == pytest.approx(0.6)


async def test_two_guarded_workloads_of_different_kinds_and_one_name_keep_their_own_state(guard_cluster):
    clock = Clock()
    sup, guards = _supervisors(clock, {"chat-7d9f5b-k9m2p": healthy, "chat-0": frozen})
    probes = {"prompts": [{"name": "count", "prompt": "1, 2, 3,", "maxTokens": 8}]}
    guard_cluster.hold(DEPLOYMENT.obj(), DEPLOYMENT.replica_set(), _ready(DEPLOYMENT, "chat-7d9f5b-k9m2p", "d-0", "10.0.0.6"))
    guard_cluster.hold(STS.obj(), _ready(STS, "chat-0", "g-0", "10.0.0.5"))
    await guards.on_guard_event("ADDED", GUARD.features(probes=True).update(probes=probes).obj())
    guard = guards.guards[("ns", "g")]
    dep, sts = guard.workloads[("Deployment", "chat")], guard.workloads[("StatefulSet", "chat")]
    for _ in range(ROUNDS):
        for ws in (dep, sts):
            await guards._measure(guard, ws)
        clock.t += ROUND
    assert dep.acceptance is not None and dep.acceptance["state"] == "Ok", dep.acceptance
    assert dep.acceptance["rate"] == pytest.approx(0.6)
    assert _stalled(dep) == []
    assert _stalled(sts) == ["chat-0"], sts.measured
    assert sts.acceptance is not None and sts.acceptance["state"] == "NoTraffic", sts.acceptance

    # output probes: one configuration per workload, each probing its own pods only
    for ws in (dep, sts):
        guards._configure_probes(guard, ws)
    assert len(guards.probes.servers) == 2
    for ws in (dep, sts):
        assert [p["name"] for p in guards.probes.pods_of(ws.ref.engine_target("ns"))] == list(ws.pods)

    # the Deployment is no longer guarded: the StatefulSet's detector keeps its history (still stalled at once)
    guards._forget_workload(guard, dep)
    await guards._measure(guard, sts)
    assert _stalled(sts) == ["chat-0"], sts.measured
    assert len(guards.probes.servers) == 1
