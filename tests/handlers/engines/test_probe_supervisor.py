"""The probe supervisor against stand-in engines on loopback IPs (no cluster): which pods are probed,
learning, status bodies and when they are written, the diagnosis/remediation hook, and the loop's
one-round-in-flight guarantee. Status writes and remediation are captured by fakes here; the real
ones run in tests/integration/test_probes_cluster.py."""

from __future__ import annotations

import asyncio
import time
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from probe_standin import CORRECT, EARLY, SLOW, WRONG, WRONG_AT, ProbeStandIn, answer_for  # noqa: E402
from waiting import async_poll  # noqa: E402
from builders import GMS  # noqa: E402

from controlplane import free_port  # noqa: E402
from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator import telemetry  # noqa: E402
from gdn_operator.api.probes import ProbesSpec  # noqa: E402
from gdn_operator.handlers.engines.probes import ProbeSupervisor, ServerProbes  # noqa: E402
from gdn_operator.watch.probes import ProbeBook  # noqa: E402
from gdn_operator.watch.target import EngineTarget  # noqa: E402

PROMPTS = [[5, 6, 7], [100, 200]]
WARNED = [
    {
        "rule": "vllm#51508",
        "title": "stale zero-accept spec rows",
        "workaround": "Set asyncScheduling false",
        "mitigation": {"asyncScheduling": False},
    }
]


def probes_spec(threshold: int = 2, timeout: int = 2, **kw) -> ProbesSpec:
    return ProbesSpec.model_validate(
        {
            "intervalSeconds": 5,
            "timeoutSeconds": timeout,
            "failureThreshold": threshold,
            "prompts": [{"name": f"p{i}", "promptTokenIds": p, "maxTokens": 8, **kw} for i, p in enumerate(PROMPTS)],
        }
    )


def server(spec: ProbesSpec, warned=None, auto=True) -> ServerProbes:
    return ServerProbes(
        spec,
        generation=4,
        image="img:1",
        model="srv",
        engine="cur",
        warned=list(warned or []),
        remediation_auto=auto,
        book=ProbeBook([p.name for p in spec.prompts], spec.failure_threshold),
    )


class Fakes:
    def __init__(self):
        self.writes: list[tuple] = []
        self.remediations: list[tuple] = []

    def writer(self, target, s, body, cond):
        self.writes.append((target.namespace, target.name, body, cond))
        return {"metadata": {"generation": s.generation}, "spec": {}}

    def remediator(self, target, s, cond, obj):
        self.remediations.append((target.namespace, target.name, cond.reason))


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def engines(port):
    made: dict[str, ProbeStandIn] = {}

    def make(ip: str, **kw) -> ProbeStandIn:
        made[ip] = ProbeStandIn(ip, port, **kw)
        return made[ip]

    yield make
    for e in made.values():
        e.close()


def pod(name, ip, ready=True, engine="cur", deleting=False):
    return {"name": name, "ip": ip, "ready": ready, "engine": engine, "deleting": deleting}


def sup_for(pods, fakes, port, **kw) -> ProbeSupervisor:
    return ProbeSupervisor(lambda target: pods, writer=fakes.writer, remediator=fakes.remediator, port=port, seed=1, **kw)


async def test_probes_only_ready_pods_of_the_current_spec_and_learns(engines, port):
    a, b = engines("127.0.0.2"), engines("127.0.0.3")
    not_ready, stale = engines("127.0.0.4"), engines("127.0.0.5")
    pods = [
        pod("b", "127.0.0.3"),
        pod("a", "127.0.0.2"),
        pod("nr", "127.0.0.4", ready=False),
        pod("old", "127.0.0.5", engine="previous"),
        pod("gone", "127.0.0.6", deleting=True),
    ]
    fakes = Fakes()
    sup = sup_for(pods, fakes, port)
    s = server(probes_spec())
    cond = await sup.round(EngineTarget.server("ns", "srv"), s)
    assert cond.value is True and cond.reason == "ProbesPassing"
    assert (a.requests, b.requests, not_ready.requests, stale.requests) == (2, 2, 0, 0)
    assert a.bodies[0] == {
        "model": "srv",
        "prompt": [5, 6, 7],
        "max_tokens": 8,
        "temperature": 0.0,
        "n": 1,
        "stream": False,
        "return_token_ids": True,
    }
    ((_, _, body, _),) = fakes.writes
    assert body["podsProbed"] == 2 and body["podsSkipped"] == 1 and body["state"] == "Consistent"
    ref = body["reference"]
    assert ref["pod"] == "a" and ref["generation"] == 4 and ref["image"] == "img:1"  # first pod by name
    assert [x["tokenIds"] for x in ref["answers"]] == [answer_for(p, 8) for p in PROMPTS]
    assert [r["lastResult"] for r in body["results"]] == ["learned", "learned"]
    await sup.client.close()


async def test_unchanged_rounds_write_nothing_and_metrics_count(engines, port):
    engines("127.0.0.2")
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
    s = server(probes_spec())
    before = telemetry.PROBES.labels("ns-m", "srv", "p0", "pass")._value.get()
    await sup.round(EngineTarget.server("ns-m", "srv"), s)
    await sup.round(EngineTarget.server("ns-m", "srv"), s)
    await sup.round(EngineTarget.server("ns-m", "srv"), s)
    # round 1 learns (write), round 2 flips learned→pass (write), round 3 is identical (no write)
    assert len(fakes.writes) == 2
    assert telemetry.PROBES.labels("ns-m", "srv", "p0", "pass")._value.get() - before == 2
    assert telemetry.PROBES.labels("ns-m", "srv", "p0", "learned")._value.get() == 1
    await sup.client.close()


async def test_wrong_answers_alarm_after_threshold_diagnose_and_remediate_once(engines, port):
    e = engines("127.0.0.2")
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
    s = server(probes_spec(threshold=2), warned=WARNED)
    assert (await sup.round(EngineTarget.server("ns-w", "srv"), s)).value is True
    e.set(WRONG)
    c1 = await sup.round(EngineTarget.server("ns-w", "srv"), s)
    assert c1.value is True, "one bad round is a blip, not an alarm"
    assert not fakes.remediations
    c2 = await sup.round(EngineTarget.server("ns-w", "srv"), s)
    assert (c2.value, c2.reason) == (False, "ProbeMismatch")
    body = fakes.writes[-1][2]
    assert body["diagnosis"]["rules"] == ["vllm#51508"] and "asyncScheduling" in body["diagnosis"]["message"]
    lf = body["results"][0]["lastFailure"]
    assert lf["position"] == WRONG_AT and lf["pod"] == "a" and lf["result"] == "mismatch"
    assert fakes.remediations == [("ns-w", "srv", "ProbeMismatch")]
    assert telemetry.OUTPUT_INCONSISTENT.labels("ns-w", "srv", "GDNModelServer", "ProbeMismatch")._value.get() == 1
    e.set(EARLY)
    c3 = await sup.round(EngineTarget.server("ns-w", "srv"), s)
    assert (c3.value, c3.reason) == (False, "ProbeEarlyStop")
    assert len(fakes.remediations) == 1, "one remediation per generation"
    e.set(CORRECT)
    assert (await sup.round(EngineTarget.server("ns-w", "srv"), s)).value is True
    assert telemetry.OUTPUT_INCONSISTENT.labels("ns-w", "srv", "GDNModelServer", "ProbeMismatch")._value.get() == 0
    await sup.client.close()


async def test_no_answer_in_time_is_probe_timeout_unknown_without_remediation(engines, port):
    """Issue 38: a timeout is not a wrong answer: OutputConsistent Unknown/ProbeTimeout, gdn_probe_failing (the
    warning alert's metric) instead of gdn_output_inconsistent (the critical one), no remediation."""
    e = engines("127.0.0.2", slow_seconds=5)
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
    s = server(probes_spec(threshold=1, timeout=1), warned=WARNED)
    await sup.round(EngineTarget.server("ns-e", "srv"), s)
    e.set(SLOW)
    c = await sup.round(EngineTarget.server("ns-e", "srv"), s)
    assert (c.value, c.reason) == (None, "ProbeTimeout") and "timeout" in c.message
    assert fakes.remediations == [] and "diagnosis" not in fakes.writes[-1][2]
    assert fakes.writes[-1][2]["state"] == "NoAnswer"
    assert telemetry.PROBE_FAILING.labels("ns-e", "srv", "GDNModelServer", "ProbeTimeout")._value.get() == 1
    for reason in ("ProbeMismatch", "ProbeEarlyStop"):
        assert telemetry.OUTPUT_INCONSISTENT.labels("ns-e", "srv", "GDNModelServer", reason)._value.get() == 0
    e.set(CORRECT)
    assert (await sup.round(EngineTarget.server("ns-e", "srv"), s)).value is True
    assert telemetry.PROBE_FAILING.labels("ns-e", "srv", "GDNModelServer", "ProbeTimeout")._value.get() == 0
    await sup.client.close()


async def test_an_engine_wanting_a_key_is_probe_unauthorized_naming_the_fix(engines, port):
    """vLLM with VLLM_API_KEY answers 401 to a probe without the key (the chart default cannot read the Secret):
    ProbeUnauthorized, Unknown, naming why the key is missing; with the key the same engine passes."""
    e = engines("127.0.0.2", api_key="sk-test")
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
    problem = "spec.apiKeySecret vllm-key/key cannot be read: the operator may not read Secrets here; set the chart value operator.readApiKeySecrets=true"
    s = server(probes_spec(threshold=1))
    s.api_key_problem = problem
    c = await sup.round(EngineTarget.server("ns-k", "srv"), s)
    assert (c.value, c.reason) == (None, "ProbeUnauthorized") and e.unauthorized == len(PROMPTS)
    assert "operator.readApiKeySecrets=true" in c.message and "HTTP 401" in c.message
    assert telemetry.PROBE_FAILING.labels("ns-k", "srv", "GDNModelServer", "ProbeUnauthorized")._value.get() == 1
    assert telemetry.OUTPUT_INCONSISTENT.labels("ns-k", "srv", "GDNModelServer", "ProbeMismatch")._value.get() == 0
    keyed = server(probes_spec(threshold=1))
    keyed.api_key = "sk-test"
    assert (await sup.round(EngineTarget.server("ns-k2", "srv"), keyed)).value is True
    await sup.client.close()


async def test_no_remediation_without_a_warned_rule_or_with_remediation_off(engines, port):
    e = engines("127.0.0.2")
    for warned, auto in (([], True), (WARNED, False)):
        fakes = Fakes()
        sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
        s = server(probes_spec(threshold=1), warned=warned, auto=auto)
        e.set(CORRECT)
        await sup.round(EngineTarget.server("ns-n", "srv"), s)
        e.set(WRONG)
        assert (await sup.round(EngineTarget.server("ns-n", "srv"), s)).value is False
        assert fakes.remediations == []
        assert ("diagnosis" in fakes.writes[-1][2]) == bool(warned)
        await sup.client.close()


async def test_no_ready_pod_reports_and_keeps_learning(port):
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2", ready=False)], fakes, port)
    s = server(probes_spec())
    cond = await sup.round(EngineTarget.server("ns-0", "srv"), s)
    assert cond.value is None and cond.reason == "Learning"
    assert fakes.writes[-1][2]["state"] == "NoReadyEngines" and "reference" not in fakes.writes[-1][2]


async def test_loop_keeps_one_round_in_flight_per_pod_and_jitters(engines, port):
    e = engines("127.0.0.2", delay=0.15)
    fakes = Fakes()
    sup = sup_for([pod("a", "127.0.0.2")], fakes, port)
    sup.tick = 0.01
    s = server(probes_spec())
    sup.configure(EngineTarget.server("ns-l", "srv"), s)
    assert 0 <= s.next_due - asyncio.get_running_loop().time() <= 5.5  # first round placed inside the interval
    s.next_due = 0
    sup.rng.uniform = lambda a, b: 0.0  # every tick is "due": only the in-flight guard spaces the rounds
    task = asyncio.get_running_loop().create_task(sup.run())
    await async_poll(lambda: e.requests, until=lambda n: n >= 6, timeout=10, interval=0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert e.requests >= 6 and e.max_in_flight == 1


# ------------------------------------------------------------------ configuration from the object ---

#: the README's server with one probe
PROBED = GMS("srv").flagship().update(prefixCaching=False, probes={"prompts": [{"name": "q", "promptTokenIds": [1, 2]}]})
SERVED = PROBED.uid("u").status({})  # as the operator reads it


@pytest.fixture
def no_api(rt):
    return rt  # a runtime whose cluster serves no optional CRD


def test_server_from_body_renders_the_engine_identity_pods_are_matched_with(no_api):
    from gdn_operator.handlers.engines.probes import server_from_body
    from gdn_operator.handlers.core.plan import expected_objects
    from gdn_operator.handlers.core.pods import pod_summary

    s = server_from_body(SERVED.generation(3).update(asyncScheduling=True).obj(), no_api)  # async set on: vllm#51508 warned
    assert s.spec is not None and s.generation == 3 and s.model == "srv"
    assert s.image == "vllm/vllm-openai:v0.33.0" and s.remediation_auto
    assert [w["rule"] for w in s.warned] == ["vllm#51508"] and s.warned[0]["mitigation"] == {"asyncScheduling": False}
    dep = next(
        o for o in expected_objects(SERVED.generation(3).update(asyncScheduling=True).obj(), no_api) if o["kind"] == "Deployment"
    )
    pod_body = {"metadata": {"name": "p", "uid": "x"}, "spec": dep["spec"]["template"]["spec"], "status": {}}
    assert pod_summary(pod_body)["engine"] == s.engine != ""
    other = server_from_body(SERVED.generation(4).update(asyncScheduling=False).obj(), no_api)
    assert other.engine != s.engine and other.warned == []  # a pod of the previous spec is not probed


def test_server_from_body_restores_counts_and_reference_of_the_same_generation_only(no_api):
    from gdn_operator.handlers.engines.probes import server_from_body

    saved = {
        "probes": {
            "generation": 3,
            "results": [{"probe": "q", "consecutiveFailures": 2, "lastResult": "mismatch"}],
            "reference": {
                "generation": 3,
                "image": "vllm/vllm-openai:v0.33.0",
                "pod": "p",
                "answers": [{"probe": "q", "tokenIds": [7, 8], "text": ""}],
            },
        },
        "conditions": [{"type": "OutputConsistent", "status": "True", "reason": "ProbesPassing"}],
    }
    s = server_from_body(SERVED.generation(3).status(saved).obj(), no_api)
    assert s.book.tracks["q"].consecutive == 2 and s.book.condition.value is True
    assert s.reference["q"].token_ids == (7, 8) and s.ref_meta["pod"] == "p"
    fresh = server_from_body(SERVED.generation(4).status(saved).obj(), no_api)
    assert fresh.book.tracks["q"].consecutive == 0 and fresh.reference == {} and fresh.book.condition.value is None


def test_no_probes_or_a_rejected_spec_means_nothing_to_probe(no_api):
    from gdn_operator.handlers.engines.probes import server_from_body

    assert server_from_body(SERVED.generation(1).update(probes=None).obj(), no_api).spec is None
    assert server_from_body(SERVED.generation(1).set("probes.enabled", False).obj(), no_api).spec is None
    rejected = (
        SERVED.generation(1).update(prefixCaching=True).obj()
    )  # vllm#43559 prefix caching + MTP: rejected under the default policy
    assert server_from_body(rejected, no_api).spec is None


# A remediation override of asyncScheduling (what handlers/remediation.remediate_once records on generation 3)
OVERRIDE = {
    "path": "asyncScheduling",
    "value": False,
    "reason": "vllm#51508",
    "source": "remediation",
    "generation": 3,
    "userValue": True,
    "vllmVersion": "0.33.0",
}


def test_a_remediation_override_is_a_new_revision_probed_afresh(no_api):
    """The override changes what runs without a new generation: counts, reference and the remediation hook of
    the revision before it do not carry over; the engine identity is the overridden render's."""
    from gdn_operator.handlers.engines.probes import server_from_body

    ref = {
        "generation": 3,
        "image": "vllm/vllm-openai:v0.33.0",
        "pod": "p",
        "answers": [{"probe": "q", "tokenIds": [7, 8], "text": ""}],
    }
    saved = {
        "probes": {
            "generation": 3,
            "results": [{"probe": "q", "consecutiveFailures": 3, "lastResult": "mismatch"}],
            "reference": ref,
        },
        "conditions": [{"type": "OutputConsistent", "status": "False", "reason": "ProbeMismatch"}],
        "remediations": [
            {
                "signature": "vllm#51508",
                "generation": 3,
                "revision": "3",
                "action": "asyncScheduling=false",
                "reason": "output probes: ProbeMismatch on generation 3 matches vllm#51508",
            }
        ],
    }
    before = server_from_body(SERVED.generation(3).update(asyncScheduling=True).status(saved).obj(), no_api)
    assert before.revision == "3" and before.remediated and before.reference["q"].token_ids == (7, 8)
    assert before.book.tracks["q"].consecutive == 3 and [w["rule"] for w in before.warned] == ["vllm#51508"]

    after = server_from_body(
        SERVED.generation(3).update(asyncScheduling=True).status({**saved, "overrides": [OVERRIDE]}).obj(), no_api
    )
    assert after.generation == 3 and after.revision.startswith("3+") and after.revision != before.revision
    assert after.reference == {} and after.book.tracks["q"].consecutive == 0 and after.book.condition.value is None
    assert not after.remediated and after.warned == []  # the override's value is what the rules judge now
    assert after.engine != before.engine  # pods of the pre-override render are not probed
    plain = server_from_body(SERVED.generation(4).update(asyncScheduling=False).obj(), no_api)
    assert after.engine == plain.engine  # the override renders what setting the field would

    # an operator restart on the overridden revision carries its own counts and reference over
    saved2 = {
        **saved,
        "overrides": [OVERRIDE],
        "probes": {
            "generation": 3,
            "revision": after.revision,
            "results": [{"probe": "q", "consecutiveFailures": 1}],
            "reference": {**ref, "revision": after.revision, "answers": [{"probe": "q", "tokenIds": [9], "text": ""}]},
        },
    }
    again = server_from_body(SERVED.generation(3).update(asyncScheduling=True).status(saved2).obj(), no_api)
    assert again.revision == after.revision and again.book.tracks["q"].consecutive == 1
    assert again.reference["q"].token_ids == (9,) and again.ref_meta["revision"] == after.revision


async def test_track_re_learns_when_the_overrides_change_not_on_other_status_events(no_api):
    sup = ProbeSupervisor(lambda target: [], rt=no_api, seed=1)
    try:
        await sup.track("ns", "srv", SERVED.generation(3).update(asyncScheduling=True).obj())
        first = sup.servers[EngineTarget.server("ns", "srv")]
        assert first.revision == "3"
        await sup.track(
            "ns", "srv", SERVED.generation(3).update(asyncScheduling=True).status({"acceptance": {"state": "NoTraffic"}}).obj()
        )
        assert sup.servers[EngineTarget.server("ns", "srv")] is first  # a status-only event: the same state, nothing re-learned
        await sup.track("ns", "srv", SERVED.generation(3).update(asyncScheduling=True).status({"overrides": [OVERRIDE]}).obj())
        second = sup.servers[EngineTarget.server("ns", "srv")]
        assert second is not first and second.generation == 3 and second.revision.startswith("3+")
        from gdn_operator.api.overrides import CLEAR_ANNOTATION

        acted_on = (
            SERVED.generation(3).update(asyncScheduling=True).status({"overrides": [OVERRIDE], "overridesCleared": "t0"}).obj()
        )
        acted_on["metadata"]["annotations"] = {CLEAR_ANNOTATION: "t0"}  # a token already acted on: still in force
        await sup.track("ns", "srv", acted_on)
        assert sup.servers[EngineTarget.server("ns", "srv")] is second
        acted_on["metadata"]["annotations"] = {CLEAR_ANNOTATION: "t1"}  # a new token ends the override
        await sup.track("ns", "srv", acted_on)
        assert sup.servers[EngineTarget.server("ns", "srv")].revision == "3"
    finally:
        sup.forget(EngineTarget.server("ns", "srv"))
        await sup.client.close()


def test_a_round_of_the_revision_before_an_override_writes_nothing(monkeypatch):
    from gdn_operator.handlers.engines import probes as hp
    from gdn_operator.watch.probes import Condition

    s = server(probes_spec())
    s.revision = "4"
    obj = PROBED.generation(4).update(asyncScheduling=True).obj()
    seen: list[dict] = []

    def update_status(ns, name, mutate, **_kw):
        for status in ({}, {"overrides": [{**OVERRIDE, "generation": 4}]}):
            st = dict(status)
            mutate(st, {**obj, "status": status})
            seen.append(st)
        return None

    monkeypatch.setattr(statusguard, "update_status", update_status)
    hp.write_status(
        Servers(), EngineTarget.server("ns", "srv"), s, {"state": "Consistent"}, Condition(True, "ProbesPassing", "ok")
    )
    assert seen[0].get("probes") == {"state": "Consistent"}  # same revision: written
    assert "probes" not in seen[1]  # an override landed under the round: its results belong to nobody


async def test_the_override_is_rendered_even_when_its_new_revision_cancels_the_round(engines, port, monkeypatch, no_api):
    """Recording the override writes status; the operator sees a new revision and re-tracks the server, which
    cancels the running round — the override must still be rendered (overrides.reapply)."""
    from gdn_operator.handlers.engines import probes as hp

    e = engines("127.0.0.2")
    rendered: list[tuple] = []
    monkeypatch.setattr(hp, "reapply", lambda ns, name, rt: rendered.append((ns, name)) or True)
    loop = asyncio.get_running_loop()
    rounds: list[asyncio.Task] = []

    def remediator(target, s, cond, obj):  # runs in a worker thread, like the real one
        loop.call_soon_threadsafe(rounds[0].cancel)  # what configure() does on the new revision
        time.sleep(0.3)
        return True

    sup = ProbeSupervisor(
        lambda target: [pod("a", "127.0.0.2")], writer=Fakes().writer, remediator=remediator, port=port, seed=1, rt=no_api
    )
    s = server(probes_spec(threshold=1), warned=WARNED)
    assert (await sup.round(EngineTarget.server("ns-c", "srv"), s)).value is True
    e.set(WRONG)
    rounds.append(loop.create_task(sup.round(EngineTarget.server("ns-c", "srv"), s)))
    with pytest.raises(asyncio.CancelledError):
        await rounds[0]
    _, met = await async_poll(lambda: rendered, timeout=10)
    assert met, "the override was recorded but never rendered"
    assert rendered == [("ns-c", "srv")]
    await sup.client.close()
