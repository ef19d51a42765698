"""The guard supervisor (handlers/guard/supervisor.py) without an API server: GuardSupervisor fed the GDNGuard and
pod events kopf would hand it, its one round run by the test, and the cluster a fake in place of handlers/guard/client.py
(the guard path's one door to the API server: tests/handlers/guard_cluster.py; any other call fails the test).

A guarded workload's engine pod event carrying a known crash (vllm#36917's AssertionError as its termination message)
becomes a CrashDiagnosed finding in exactly one status write of the guard, with one Event on the workload; an
unchanged round writes nothing; a pod event that is no finding (a clean exit, a re-delivered death) writes nothing;
pods the guard does not select (other labels, another namespace, the operator's own engines) are never tracked; a
stall verdict of the shared stall watch (scripted engines, the test's clock) is a Stalled finding and one Event.
Each test runs in well under a second.
"""

from __future__ import annotations

from typing import Any

import pytest

from gdn_operator.handlers.engines import acceptance as acc
from gdn_operator.handlers.engines.stall import StallWatch
from gdn_operator.labels import LABEL_SERVER
from gdn_operator.watch.acceptance import AcceptanceTracker

from builders import CLEAN_ARGS, EnginePod, Guard, Workload
from scripted_engines import ROUND, ROUNDS, Clock, Engines, frozen, healthy

#: vllm#36917: GDN attention asserting on a decode batch mixed with spec-decode requests (the signature catalogue's
#: gdn-mixed-spec-decode-assert), as the engine container's termination message carries it
CRASH = "AssertionError: num_decodes: 1, num_spec_decodes: 4"
#: a Deployment the guard selects, running 0.33.0 with the known risks turned off (no KnownCrash finding)
CHAT = Workload("chat", namespace="ns").uid("d-uid").labelled({"app": "chat"}).args(*CLEAN_ARGS)
GUARD = Guard("g").select({"app": "chat"}).uid("g-uid").generation(1)
POD = "chat-7d9f5b-x2x4q"


def engine_pod(w: Workload, name: str = POD, restarts: int = 0, died: dict[str, Any] | None = None) -> EnginePod:
    """An engine pod of `w` loading its model: running, not yet Ready (nothing to scrape). `died`: the lastState of
    its engine container's `restarts`-th death, the kubelet backing off before the next start."""
    p = w.pod(name).uid(f"{name}-uid").phase("Running").ip("10.0.0.7").ready(False)
    if died is None:
        return p.container(restartCount=restarts, state={"running": {}})
    return p.container(restartCount=restarts, state=EnginePod.waiting("CrashLoopBackOff"), lastState=died)


def crashed(w: Workload, restarts: int, name: str = POD) -> EnginePod:
    return engine_pod(w, name, restarts, EnginePod.terminated(1, "Error", CRASH))


class Followers:
    """The crash watch's log followers (handlers/engines/logfollow.py) as the guard asks for them: recorded, not
    started (a follower streams the pod's log from the API server)."""

    def __init__(self) -> None:
        self.followed: set[tuple[str, str, str]] = set()  # (namespace, pod, container)
        self.stopped: list[str] = []  # pod uids

    def ensure(self, namespace: str, pod: dict[str, Any], container: str) -> None:
        self.followed.add((namespace, pod["metadata"]["name"], container))

    def stop(self, uid: str) -> None:
        self.stopped.append(uid)


@pytest.fixture
def sup(rt):
    """The runtime's guard supervisor, as the operator holds it (the guard admission has published nothing)."""
    rt.followers = Followers()
    return rt.guards


def findings_of(status: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {(w["kind"], w["name"]): w["findings"] for w in status["workloads"]}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


async def test_a_known_crash_of_a_guarded_engine_is_one_finding_in_one_status_write(guard_cluster, sup):
    guard_cluster.hold(CHAT.obj(), CHAT.replica_set(), engine_pod(CHAT).obj())
    await sup.on_guard_event("ADDED", GUARD.obj())  # lists the pods it selects: the engine pod, starting
    assert list(sup.pod_home) == [("ns", POD)]
    await sup.on_pod_event("MODIFIED", crashed(CHAT, 1).obj())
    guard = sup.guards[("ns", "g")]
    await sup.round(guard)

    assert len(guard_cluster.status_writes) == 1, guard_cluster.status_writes
    ns, name, status = guard_cluster.status_writes[0]
    assert (ns, name, status["observedGeneration"]) == ("ns", "g", 1)
    (finding,) = findings_of(status)[("Deployment", "chat")]  # the pod's workload: up the owner chain, not the RS
    assert (finding["type"], finding["rule"], finding["pod"], finding["count"]) == ("CrashDiagnosed", "vllm#36917", POD, 1)
    assert "gdn-mixed-spec-decode-assert" in finding["message"] and "restart 1, exit 1" in finding["message"]
    crash = condition(status, "CrashDiagnosed")
    assert crash is not None and crash["status"] == "True" and POD in crash["message"]
    ready = condition(status, "Ready")
    assert ready is not None and (ready["status"], ready["message"]) == ("True", "1 workload(s), 1 engine pod(s) guarded")
    # one Event, on the Deployment; the owner chain read once (the ReplicaSet, then its Deployment); nothing deleted
    assert [e[:3] for e in guard_cluster.events] == [("Deployment", "chat", "EngineCrashed")]
    assert "vllm#36917" in guard_cluster.events[0][3]
    assert guard_cluster.owner_reads == [("ReplicaSet", "chat-7d9f5b"), ("Deployment", "chat")]
    assert guard_cluster.deleted == []
    assert sup.rt.followers.followed == {("ns", POD, "vllm")}  # the crash watch follows the engine container's log
    (report,) = guard_cluster.reports  # the namespace's PolicyReport, from the status just written
    assert [(r["rule"], r["resources"][0]["kind"]) for r in report["results"]] == [("vllm#36917", "Deployment")]

    # nothing new: the round writes nothing; the same death delivered again is not counted again
    await sup.round(guard)
    await sup.on_pod_event("MODIFIED", crashed(CHAT, 1).obj())
    await sup.round(guard)
    assert len(guard_cluster.status_writes) == 1 and len(guard_cluster.events) == 1
    assert guard_cluster.owner_reads == [("ReplicaSet", "chat-7d9f5b"), ("Deployment", "chat")]  # cached by uid

    # the next death with the same signature: one more write, the count at 2, still reported (remediation is off)
    await sup.on_pod_event("MODIFIED", crashed(CHAT, 2).obj())
    await sup.round(guard)
    assert len(guard_cluster.status_writes) == 2
    (finding,) = findings_of(guard_cluster.status_writes[1][2])[("Deployment", "chat")]
    assert (finding["rule"], finding["count"]) == ("vllm#36917", 2)
    assert guard_cluster.deleted == []


async def test_a_pod_event_that_is_no_finding_writes_nothing(guard_cluster, sup):
    guard_cluster.hold(CHAT.obj(), CHAT.replica_set(), engine_pod(CHAT).obj())
    await sup.on_guard_event("ADDED", GUARD.obj())
    guard = sup.guards[("ns", "g")]
    await sup.round(guard)  # the guard's first status: its workload, no finding
    assert len(guard_cluster.status_writes) == 1
    assert findings_of(guard_cluster.status_writes[0][2]) == {("Deployment", "chat"): []}

    # the engine exits cleanly (Completed: a shutdown, not a crash), and the pod goes on loading its model
    await sup.on_pod_event("MODIFIED", engine_pod(CHAT, restarts=1, died=EnginePod.terminated(0, "Completed")).obj())
    await sup.on_pod_event("MODIFIED", engine_pod(CHAT, restarts=1).condition("ContainersReady", "False").obj())
    await sup.round(guard)
    assert len(guard_cluster.status_writes) == 1, guard_cluster.status_writes[1:]
    assert guard_cluster.events == [] and guard_cluster.deleted == []


async def test_pods_the_guard_does_not_select_are_never_tracked(guard_cluster, sup):
    other = Workload("other", namespace="ns").labelled({"app": "other"}).args(*CLEAN_ARGS)
    elsewhere = Workload("chat", namespace="team").labelled({"app": "chat"}).args(*CLEAN_ARGS)
    ours = crashed(CHAT, 1, "s-0").labels({LABEL_SERVER: "chat"})  # a GDNModelServer's engine, labelled app=chat too
    pods = [crashed(other, 1, "other-0"), crashed(elsewhere, 1), ours]
    guard_cluster.hold(other.obj(), other.replica_set(), elsewhere.obj(), elsewhere.replica_set(), *(p.obj() for p in pods))
    await sup.on_guard_event("ADDED", GUARD.obj())
    for p in pods:
        await sup.on_pod_event("MODIFIED", p.obj())
    assert sup.pod_home == {} and sup.guards[("ns", "g")].workloads == {}
    await sup.round(sup.guards[("ns", "g")])

    (_, _, status), *more = guard_cluster.status_writes
    assert more == [] and status["workloads"] == []
    ready = condition(status, "Ready")
    assert ready is not None and ready["message"] == "0 workload(s), 0 engine pod(s) guarded"
    assert condition(status, "CrashDiagnosed") is None
    assert guard_cluster.events == [] and guard_cluster.owner_reads == []  # not even its owner chain was read
    assert sup.rt.followers.followed == set()


async def test_a_stalled_engine_is_a_stalled_finding_and_one_event(guard_cluster, sup, rt):
    """The stall verdict of the shared stall watch (requests running, no tokens for the guard's stall_seconds while
    the engine answers) on a guarded StatefulSet's pod: a Stalled finding in status, one Event however many rounds
    it holds, the healthy pod beside it never flagged, and no write between the guard's first status and the verdict.
    (While it holds, each round writes: the finding's message counts the seconds without progress, as a
    GDNModelServer's status.stall does.)"""
    clock = Clock()
    rt.acceptance = acc.AcceptanceSupervisor(
        AcceptanceTracker(window=60, clock=clock), Engines(clock, {"chat-0": healthy, "chat-1": frozen}), 1, rt.servers
    )
    rt.acceptance.stall = StallWatch(clock)
    sts = Workload("chat", "StatefulSet", namespace="ns").uid("sts-uid").labelled({"app": "chat"}).args(*CLEAN_ARGS)
    pods = [
        sts.pod(p).uid(f"{p}-uid").phase("Running").ip(ip).ready() for p, ip in (("chat-0", "10.0.0.5"), ("chat-1", "10.0.0.6"))
    ]
    guard_cluster.hold(sts.obj(), *(p.obj() for p in pods))
    await sup.on_guard_event("ADDED", GUARD.features(acceptance=False).obj())  # stall only: no acceptance figures
    guard = sup.guards[("ns", "g")]
    for _ in range(ROUNDS):
        await sup.round(guard)
        clock.t += ROUND
    writes = [w[2] for w in guard_cluster.status_writes]
    # the guard's first status: the workload, its 2 pods, no finding; no write after it until the verdict
    assert findings_of(writes[0]) == {("StatefulSet", "chat"): []} and writes[0]["workloads"][0]["pods"] == 2
    assert len(writes) >= 2, writes
    for w in writes[1:]:
        assert [(f["type"], f["pod"]) for f in findings_of(w)[("StatefulSet", "chat")]] == [("Stalled", "chat-1")], w
    status = guard_cluster.status_writes[-1][2]
    (finding,) = findings_of(status)[("StatefulSet", "chat")]
    assert (finding["type"], finding["rule"], finding["pod"]) == ("Stalled", "engine-stall", "chat-1")
    assert "8 requests running" in finding["message"] and "while /health answers" in finding["message"]
    cond = condition(status, "Stalled")
    assert cond is not None and cond["status"] == "True" and "chat-1" in cond["message"]
    assert condition(status, "Degraded") is None and "phase" not in status  # the guard's conditions only
    assert [e[:3] for e in guard_cluster.events] == [("StatefulSet", "chat", "Stalled")]
    assert guard_cluster.deleted == []  # remediation off: reported, never acted on
