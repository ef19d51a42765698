"""Stall watch (handlers/engines/stall.py) without an API server: verdicts per pod from scrape results (a failed scrape
keeps the last known one), status.stall and condition Stalled with one Event per transition, Degraded derived,
gauges, and the ladder (restart once per generation, then the G1 advice, remediation.mode respected).
The real-control-plane run is tests/integration/test_stall_cluster.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from stall_replay import exposition

from gdn_operator import telemetry
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.engines import stall
from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.core import conditions as st
from gdn_operator.watch.acceptance import parse_exposition
from gdn_operator.watch.target import EngineTarget
from gdn_operator.watch.scraper import ScrapeResult, Target

from builders import GMS

#: vLLM 0.22.0, the version the stall G1 is known on (vllm-known-issues.md)
G1_SERVER = GMS("srv").version("0.22.0").update(tensorParallelSize=2)
FROZEN = {"running": 8, "waiting": 0, "generation_tokens": 40000, "prompt_tokens": 130000, "draft_tokens": 78000}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def result(pod: str, point: dict[str, Any] | None) -> ScrapeResult:
    t = Target(EngineTarget.server("ns", "srv"), pod, f"http://10.0.0.1:8000/metrics#{pod}")
    if point is None:
        return ScrapeResult(t, None, "timeout", "no answer")
    return ScrapeResult(t, parse_exposition(exposition(point)))


PODS = [{"name": "p0", "uid": "u0", "group": None}, {"name": "p1", "uid": "u1", "group": None}]


def rounds(watch: stall.StallWatch, clock: Clock, n: int, points: dict[str, dict[str, Any] | None], every: float = 15):
    out = []
    for _ in range(n):
        out = watch.observe_round(EngineTarget.server("ns", "srv"), 60, PODS, [result(p, pt) for p, pt in points.items()])
        clock.t += every
    return out


def test_frozen_pod_is_flagged_the_progressing_one_not_and_gauges_follow():
    clock = Clock()
    w = stall.StallWatch(clock)
    gen = {"p1": 0.0}

    def progressing():
        gen["p1"] += 8 * 20 * 15
        return dict(FROZEN, generation_tokens=gen["p1"])

    for _ in range(6):
        vs = w.observe_round(EngineTarget.server("ns", "srv"), 60, PODS, [result("p0", FROZEN), result("p1", progressing())])
        clock.t += 15
    by = {v.pod: v for v in vs}
    assert by["p0"].verdict.stalled and by["p0"].since is not None and not by["p1"].verdict.stalled
    assert telemetry.ENGINE_STALLED.labels("ns", "srv", "p0")._value.get() == 1
    assert telemetry.ENGINE_STALLED.labels("ns", "srv", "p1")._value.get() == 0
    assert telemetry.ENGINE_SECONDS_WITHOUT_PROGRESS.labels("ns", "srv", "p0")._value.get() >= 60
    # a failed scrape keeps the pod's last known verdict (MetricsAvailable reports the failure)
    vs = w.observe_round(EngineTarget.server("ns", "srv"), 60, PODS, [result("p0", None), result("p1", progressing())])
    assert {v.pod: v for v in vs}["p0"].verdict.stalled
    # the pod is replaced (new uid): its detector and gauges start again
    w.observe_round(EngineTarget.server("ns", "srv"), 60, [{"name": "p0", "uid": "u9"}], [result("p0", FROZEN)])
    assert not w.observe_round(EngineTarget.server("ns", "srv"), 60, [{"name": "p0", "uid": "u9"}], [result("p0", FROZEN)])[
        0
    ].verdict.stalled
    w.forget(EngineTarget.server("ns", "srv"))
    assert ("ns", "srv", "p1") not in {tuple(s.labels.values()) for m in telemetry.ENGINE_STALLED.collect() for s in m.samples}


def test_status_condition_one_event_per_transition_and_degraded():
    clock = Clock()
    w = stall.StallWatch(clock)
    vs = rounds(w, clock, 6, {"p0": FROZEN})
    body = stall.stall_status(vs, 60, lambda pod: "engine core waited on its workers (repeated, 2x, ...)", lambda pod: 3)
    assert body is not None and body["stallSeconds"] == 60
    p = body["stalled"][0]
    assert (p["pod"], p["running"], p["waiting"]) == ("p0", 8, 0) and p["secondsWithoutProgress"] >= 60
    assert p["probeTimeouts"] == 3 and "repeated" in p["hangEvidence"]
    status: dict[str, Any] = {}
    ev = stall.apply_condition(status, body, 1)
    assert [e[1] for e in ev] == ["EngineStalled"]
    c = st.get_condition(status, st.STALLED)
    assert c["status"] == "True" and "p0: 8 running, 0 waiting, no progress for" in c["message"]
    assert "output probes timed out 3x" in c["message"] and "/health still answers" in c["message"]
    deg = st.get_condition(status, st.DEGRADED)
    assert deg["status"] == "True" and deg["reason"] == "EngineStalled"
    # still stalled, figures grow: status updated, no second Event
    more = copy.deepcopy(body)
    more["stalled"][0]["secondsWithoutProgress"] += 15
    assert stall.apply_condition(status, more, 1) == []
    # over: False, one Event, Degraded recovers
    ev = stall.apply_condition(status, None, 1)
    assert [e[1] for e in ev] == ["StallEnded"] and "stall" not in status
    assert st.get_condition(status, st.STALLED)["status"] == "False"
    assert st.get_condition(status, st.DEGRADED)["status"] == "False"
    assert stall.apply_condition(status, None, 1) == []


def test_no_condition_is_created_just_to_say_no_stall():
    status: dict[str, Any] = {}
    assert stall.apply_condition(status, None, 1) == [] and st.get_condition(status, st.STALLED) is None


@pytest.mark.parametrize(
    ("over", "trigger"),
    [
        ({}, True),  # unset = vLLM's default FULL_AND_PIECEWISE, MTP on
        ({"cudagraphMode": "FULL_DECODE_ONLY"}, True),
        ({"cudagraphMode": "PIECEWISE"}, False),
        ({"enforceEager": True}, False),
        ({"speculativeDecoding": {"enabled": False}}, False),
    ],
)
def test_g1_trigger_reads_the_effective_configuration(over, trigger):
    from gdn_operator.api.load import parse_spec

    assert stall.g1_trigger(parse_spec(G1_SERVER.update(**over).spec())) is trigger


class FakeKube:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: dict[str, Any]) -> None:
        self.obj, self.deleted, self.events = obj, [], []
        monkeypatch.setattr(statusguard, "update_status", self.update_status)
        monkeypatch.setattr(kube, "delete_pod", lambda ns, pod, uid: self.deleted.append((pod, uid)) or True)
        monkeypatch.setattr(kube, "emit_event", lambda obj, reason, msg, type_="Normal": self.events.append((reason, msg)))

    def update_status(self, namespace, name, mutate, retries=8, obj=None):
        status = copy.deepcopy(self.obj.get("status") or {})
        mutate(status, self.obj)
        self.obj["status"] = status
        return self.obj


def _stalled(pod: str = "p0", uid: str = "u0") -> list[stall.PodVerdict]:
    from gdn_operator.watch.stall import StallVerdict

    return [stall.PodVerdict(pod, uid, None, StallVerdict(True, 130, 8, 0, "Stalled"), 0.0)]


def test_ladder_restarts_once_then_piecewise_as_an_override(monkeypatch):
    # vLLM 0.33.0: G1 is known only on 0.22.0, its trigger (MTP + the default FULL_AND_PIECEWISE graphs) holds
    server = G1_SERVER.version("0.33.0").generation(4).status({})
    spec, obj = server.spec(), server.obj()
    k = FakeKube(monkeypatch, obj)
    restarted: set[str] = set()
    assert stall.end_stall("ns", "srv", obj, _stalled(), "m", restarted, None, Servers()) == "restart p0"
    assert k.deleted == [("p0", "u0")] and restarted == {"u0"}
    rec = obj["status"]["remediations"][-1]
    assert (rec["signature"], rec["generation"], rec["action"]) == ("engine-stall", 4, "restart p0")
    assert [e[0] for e in k.events] == ["Remediated"]
    # the same pod, still listed while it terminates: not a new stall
    assert stall.end_stall("ns", "srv", obj, _stalled(), "m", restarted, None, Servers()) is None
    # its replacement stalls too: G1's mitigation PIECEWISE as an operator-owned override (MTP stays on)
    assert stall.end_stall("ns", "srv", obj, _stalled("p9", "u9"), "m", restarted, None, Servers()) == "cudagraphMode=PIECEWISE"
    assert k.deleted == [("p0", "u0")] and obj["spec"] == spec  # the user's spec is never written
    (ov,) = obj["status"]["overrides"]
    assert (ov["path"], ov["value"], ov["reason"], ov["source"]) == (
        "cudagraphMode",
        "PIECEWISE",
        "engine-stall/cudagraph",
        "remediation",
    )
    assert k.events[-1][0] == "Remediated" and "keeps MTP on" in k.events[-1][1]
    # a new revision (the override): a stall of it starts the ladder again, with a restart
    assert stall.end_stall("ns", "srv", obj, _stalled("p8", "u8"), "m", restarted, None, Servers()) == "restart p8"
    assert len(obj["status"]["remediations"]) == 3
    # and once PIECEWISE runs, nothing automatic is left on that revision
    assert stall.end_stall("ns", "srv", obj, _stalled("p7", "u7"), "m", restarted, None, Servers()) == "advice"
    assert k.events[-1][0] == "RemediationNotPossible" and "last resort" in k.events[-1][1]
    assert stall.end_stall("ns", "srv", obj, _stalled("p6", "u6"), "m", restarted, None, Servers()) is None


def test_ladder_without_g1_trigger_says_nothing_automatic_is_left(monkeypatch):
    obj = (
        G1_SERVER.generation(1)
        .update(cudagraphMode="PIECEWISE")
        .status({"remediations": [{"signature": "engine-stall", "generation": 1, "action": "restart p0"}]})
        .obj()
    )
    k = FakeKube(monkeypatch, obj)
    assert stall.end_stall("ns", "srv", obj, _stalled("p1", "u1"), "m", set(), None, Servers()) == "advice"
    assert "no automatic step is left" in k.events[-1][1] and not k.deleted


def test_remediation_mode_none_only_reports(monkeypatch):
    obj = G1_SERVER.generation(1).update(remediation={"mode": "none"}).status({}).obj()
    k = FakeKube(monkeypatch, obj)
    assert stall.end_stall("ns", "srv", obj, _stalled(), "m", set(), None, Servers()) is None
    assert not k.deleted and not k.events and "remediations" not in obj["status"]


def test_without_stall_restart_no_pod_is_deleted_and_the_ladder_goes_on(monkeypatch):
    """Issue 48 (RBAC follows values): operator.stallRestart false grants no pod delete, so the ladder must never
    delete a pod: it goes on to the next step (here the G1 override)."""
    from gdn_operator.settings import Settings

    monkeypatch.setattr(stall, "Settings", lambda: Settings.from_env({"GDN_STALL_RESTART": "false"}))  # (inputs None)
    server = G1_SERVER.version("0.33.0").generation(4).status({})
    obj = server.obj()
    k = FakeKube(monkeypatch, obj)
    out = stall.end_stall("ns", "srv", obj, _stalled(), "m", set(), None, Servers())
    assert k.deleted == [] and out == "cudagraphMode=PIECEWISE"
