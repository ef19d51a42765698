"""Pure parts of the crash watch: which deaths a pod shows, and which spec change a remedy means."""

import pytest

from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.api.load import parse_spec
from gdn_operator.handlers.engines.crashwatch import deaths_in
from gdn_operator.api.specpatch import merge as _merged_spec
from gdn_operator.handlers.core.remediation import remediation_for

from builders import GMS, EnginePod

BASE = GMS().spec()


def test_last_and_current_termination_share_one_key():
    # Before the kubelet restarts it: state.terminated with restartCount 2 → the 3rd death.
    now = deaths_in(
        EnginePod()
        .uid("u1")
        .container(restartCount=2, state={"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}})
        .obj()
    )
    # After the restart the same death shows as lastState with restartCount 3.
    later = deaths_in(
        EnginePod()
        .uid("u1")
        .container(
            restartCount=3, state={"running": {}}, lastState={"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}
        )
        .obj()
    )
    assert [d.restart_count for d in now] == [3] == [d.restart_count for d in later]
    assert now[0].message == "boom" and now[0].exit_code == 1


def test_clean_exit_and_other_containers_are_not_deaths():
    assert (
        deaths_in(
            EnginePod().uid("u1").container(restartCount=0, state={"terminated": {"exitCode": 0, "reason": "Completed"}}).obj()
        )
        == []
    )
    p = EnginePod().uid("u1").container(restartCount=1, lastState={"terminated": {"exitCode": 1}}).obj()
    p["status"]["containerStatuses"][0]["name"] = "sidecar"
    assert deaths_in(p) == []


def test_crash_loop_backoff_is_flagged():
    d = deaths_in(
        EnginePod()
        .uid("u1")
        .container(restartCount=4, state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState={"terminated": {"exitCode": 1}})
        .obj()
    )
    assert d[0].crash_loop


@pytest.mark.parametrize(
    "action, spec, patch",
    [
        ("disable-async-scheduling", {}, {"asyncScheduling": False}),
        ("disable-async-scheduling", {"asyncScheduling": False}, None),  # already applied: never again
        ("disable-spec-decode", {}, {"speculativeDecoding": {"enabled": False}}),
        (
            "lower-num-speculative-tokens",
            {"speculativeDecoding": {"numSpeculativeTokens": 5}},
            {"speculativeDecoding": {"numSpeculativeTokens": 4}},
        ),
        ("lower-num-speculative-tokens", {"speculativeDecoding": {"numSpeculativeTokens": 1}}, None),
        ("gdn-prefill-backend-triton", {}, {"gdnPrefillBackend": "triton"}),
        ("disable-v2-model-runner", {"modelRunner": "v2"}, {"modelRunner": "v1"}),
        ("enable-chunked-prefill", {}, {"chunkedPrefill": True}),
        ("disable-prefix-caching", {}, {"prefixCaching": False}),
        ("patched-image", {}, None),  # needs a human: which image?
        ("investigate", {}, None),
    ],
)
def test_remediation_map(action, spec, patch):
    change = remediation_for(action, parse_spec({**BASE, **spec}))
    assert (change.patch if change else None) == patch


def test_merged_spec_is_deep():
    merged = _merged_spec(
        {"speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 5}, "replicas": 2},
        {"speculativeDecoding": {"numSpeculativeTokens": 4}},
    )
    assert merged == {"speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 4}, "replicas": 2}


class FakeServer:
    """Stands in for the API server in handle_death: status read-modify-write on one object."""

    def __init__(self, spec):
        self.obj = GMS().generation(1).status({}).update(**spec).obj()
        self.events = []

    def update_status(self, ns, name, mutate, retries=8, obj=None):
        status = dict(self.obj["status"])
        mutate(status, self.obj)
        self.obj["status"] = status
        return self.obj

    def emit_event(self, obj, reason, message, type_="Normal"):
        self.events.append(reason)


@pytest.fixture
def server(monkeypatch):
    from gdn_operator.handlers.core import kube

    fake = FakeServer({**BASE, "remediation": {"mode": "none"}})
    monkeypatch.setattr(statusguard, "update_status", fake.update_status)
    monkeypatch.setattr(kube, "emit_event", fake.emit_event)
    return fake


def death(pod, restarts, finished, args=()):
    from gdn_operator.handlers.engines.crashwatch import Death

    return Death(
        pod,
        f"uid-{pod}",
        "vllm",
        restarts,
        1,
        "Error",
        "AssertionError: num_decodes: 1, num_spec_decodes: 4",
        finished,
        False,
        tuple(args),
    )


def test_replayed_deaths_after_an_operator_restart_are_not_counted_again(server, rt):
    from runtime_helpers import make_runtime
    from gdn_operator.handlers.engines import crashwatch

    crashwatch.handle_death(rt, "ns", "s", death("a", 1, "2026-11-22T10:00:01Z"))
    crashwatch.handle_death(rt, "ns", "s", death("b", 1, "2026-11-22T10:00:05Z"))
    assert server.obj["status"]["lastCrash"]["count"] == 2
    restarted = make_runtime()  # operator restarted (a new runtime): kopf lists the pods again
    crashwatch.handle_death(restarted, "ns", "s", death("a", 1, "2026-11-22T10:00:01Z"))
    crashwatch.handle_death(restarted, "ns", "s", death("b", 1, "2026-11-22T10:00:05Z"))
    assert server.obj["status"]["lastCrash"]["count"] == 2
    assert server.events.count("EngineCrashed") == 2


def test_crash_of_a_pod_running_a_previous_spec_is_reported_but_not_counted(server, monkeypatch, rt):
    from gdn_operator.handlers.engines import crashwatch

    monkeypatch.setattr(crashwatch, "_current_args", lambda obj, rt: {("current",)})  # every argv the workload runs
    crashwatch.handle_death(rt, "ns", "s", death("new", 1, "2026-11-22T10:00:01Z", args=("current",)))
    crashwatch.handle_death(rt, "ns", "s", death("old", 3, "2026-11-22T10:00:02Z", args=("previous",)))
    lc = server.obj["status"]["lastCrash"]
    assert lc["pod"] == "old" and lc["count"] == 1


def test_change_from_a_rule_mitigation_is_a_merge_patch_and_never_reapplied():
    from gdn_operator.handlers.core.remediation import change_from_mitigation

    c = change_from_mitigation("vllm#51508", {"asyncScheduling": False}, {})
    assert c.patch == {"asyncScheduling": False} and c.action == "asyncScheduling=false"
    assert change_from_mitigation("vllm#51508", {"asyncScheduling": False}, {"asyncScheduling": False}) is None
    nested = change_from_mitigation(
        "r",
        {"speculativeDecoding.enabled": False, "prefixCaching": None},
        {"speculativeDecoding": {"enabled": True}, "prefixCaching": True},
    )
    assert nested.patch == {"speculativeDecoding": {"enabled": False}, "prefixCaching": None}  # null unsets (merge patch)
    assert change_from_mitigation("r", None, {}) is None


# ------------------------------------------------------------------------------------------------
# issue 18: under TP >= 2 the illegal-address remediation keeps MTP on as long as it can


B4_TAIL = (
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1927, in _update_states_after_model_execute\n'
    "    self.num_accepted_tokens_event.synchronize()\n"
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
)
# prefixCaching false: MTP + prefix caching is itself refused on 0.33.0 (vllm#43559)
TP2 = {**BASE, "tensorParallelSize": 2, "speculativeDecoding": {"numSpeculativeTokens": 2}, "prefixCaching": False}
P2P = {"env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}, {"name": "OTHER", "value": "x"}]}
#: async scheduling set on by the user (unset, it already resolves to off: vllm#51508's safe default)
TP2A = {**TP2, "asyncScheduling": True}


def b4_result():
    from gdn_operator.watch.signatures import classify_text

    r = classify_text(B4_TAIL)
    assert r.signature == "cuda-illegal-address-accepted-sync" and r.upstream == "vllm#41190"
    return r


def test_drop_nccl_p2p_disable_remediation():
    change = remediation_for("drop-nccl-p2p-disable", parse_spec({**BASE, **P2P}))
    assert change.patch == {"env": [{"name": "OTHER", "value": "x"}]}
    assert remediation_for("drop-nccl-p2p-disable", parse_spec(BASE)) is None


@pytest.mark.parametrize(
    "spec, tried, action, reason",
    [
        ({**TP2, **P2P}, [], "env NCCL_P2P_DISABLE removed", "step 1 of 2 that keep speculative decoding on"),
        (TP2A, ["env NCCL_P2P_DISABLE removed"], "asyncScheduling=false", "step 2 of 2"),
        # the user put NCCL_P2P_DISABLE=1 back after step 1: async off alone would still be refused by
        # admission (vllm#41190 is enforced with P2P disabled), so only the last resort is left
        (
            {**TP2A, **P2P},
            ["env NCCL_P2P_DISABLE removed"],
            "speculativeDecoding.enabled=false",
            "would itself be refused by admission",
        ),
        (TP2A, [], "asyncScheduling=false", "step 2 of 2"),  # P2P not disabled: step 1 does not apply
        # async left unset already runs off (safe default): step 2 is in effect, only the last resort is left
        (TP2, [], "speculativeDecoding.enabled=false", "last resort"),
        ({**TP2, "asyncScheduling": False}, [], "speculativeDecoding.enabled=false", "last resort"),
        (TP2A, ["asyncScheduling=false"], "speculativeDecoding.enabled=false", "asyncScheduling=false (tried before)"),
        (
            {**BASE, "speculativeDecoding": {"numSpeculativeTokens": 2}},
            [],
            "speculativeDecoding.enabled=false",
            None,
        ),  # TP=1: no ladder
    ],
)
def test_tp2_illegal_address_ladder_keeps_mtp_on_first(spec, tried, action, reason):
    from gdn_operator.handlers.core.remediation import choose_remediation

    obj = {
        "spec": spec,
        "status": {
            "remediations": [
                {"signature": "cuda-illegal-address-accepted-sync", "action": a, "generation": g} for g, a in enumerate(tried, 1)
            ]
        },
    }
    from gdn_operator.handlers.core.remediation import running_spec

    change, refusal, why = choose_remediation(
        "cuda-illegal-address-accepted-sync", b4_result(), running_spec(obj, "reject"), obj, "reject"
    )
    assert refusal is None and change.action == action
    if reason is None:
        assert why is None
    else:
        assert reason in why


def test_ladder_runs_as_overrides_and_never_writes_the_spec(monkeypatch):
    """Three crash loops on one generation: P2P back on, then async off, then (last resort) MTP off, each an
    operator override (status.overrides) with its reason; the spec and its generation never change, and each
    decision is made once per revision (generation + the overrides in force)."""
    import copy

    from gdn_operator.handlers.core import kube

    from gdn_operator.handlers.core import remediation

    fake = FakeServer({**TP2A, **P2P, "remediation": {"mode": "auto", "threshold": 1}})
    submitted = copy.deepcopy(fake.obj["spec"])
    monkeypatch.setattr(statusguard, "update_status", fake.update_status)
    monkeypatch.setattr(kube, "emit_event", lambda obj, reason, msg, type_="Normal": fake.events.append((reason, msg)))
    applied = []
    for _ in range(4):
        change = remediation.maybe_remediate(Servers(), "ns", "s", fake.obj, b4_result(), 1, 1, policy="reject")
        applied.append(change.action if change else None)
    assert applied == ["env NCCL_P2P_DISABLE removed", "asyncScheduling=false", "speculativeDecoding.enabled=false", None]
    assert fake.obj["spec"] == submitted and fake.obj["metadata"]["generation"] == 1
    rem = fake.obj["status"]["remediations"]
    assert [r["generation"] for r in rem] == [1, 1, 1, 1] and len({r["revision"] for r in rem}) == 4
    assert "step 1 of 2" in rem[0]["reason"] and "NCCL_P2P_DISABLE=1" in rem[0]["reason"]
    assert "step 2 of 2" in rem[1]["reason"] and "async" in rem[1]["reason"]
    assert "last resort" in rem[2]["reason"] and rem[3]["action"] == "none"
    ov = {o["path"]: o for o in fake.obj["status"]["overrides"]}
    assert ov["asyncScheduling"]["value"] is False and ov["speculativeDecoding.enabled"]["value"] is False
    assert ov["env"]["value"] == [{"name": "OTHER", "value": "x"}]
    assert {o["reason"] for o in ov.values()} == {"cuda-illegal-address-accepted-sync"}
    assert all(o["generation"] == 1 and o["source"] == "remediation" and o["since"] for o in ov.values())
    assert ov["asyncScheduling"]["userValue"] is True  # what the user's spec says there
    cond = next(c for c in fake.obj["status"]["conditions"] if c["type"] == "Overridden")
    assert cond["status"] == "True" and "asyncScheduling" in cond["message"]
    # what runs: the overrides applied
    run = remediation.running_spec(fake.obj, "reject")
    assert run.async_scheduling is False and not run.speculative_decoding.enabled and len(run.env) == 1
    # a second crash on the same revision decides nothing new
    assert remediation.maybe_remediate(Servers(), "ns", "s", fake.obj, b4_result(), 2, 1, policy="reject") is None
    assert len(fake.obj["status"]["remediations"]) == 4


def test_generic_class_without_evidence_is_never_remediated(monkeypatch):
    from gdn_operator.handlers.core import kube
    from gdn_operator.handlers.core import remediation
    from gdn_operator.watch.signatures import classify_text

    fake = FakeServer({**TP2, "remediation": {"mode": "auto", "threshold": 1}})
    monkeypatch.setattr(statusguard, "update_status", fake.update_status)
    monkeypatch.setattr(kube, "emit_event", fake.emit_event)
    r = classify_text(
        "[rank1]:[E0601 04:12:55.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600077 milliseconds before timing out.\n"
    )
    assert r.signature == "nccl-watchdog-timeout" and r.upstream is None
    assert remediation.maybe_remediate(Servers(), "ns", "s", fake.obj, r, 3, 1, policy="reject") is None
    assert fake.obj["status"]["remediations"][0]["action"] == "none"


def test_one_crash_degrades_until_the_quiet_period_clears_it(server, rt):
    from gdn_operator.handlers.engines import crashwatch
    from gdn_operator.handlers.engines import quiet
    from gdn_operator.handlers.core import conditions as st
    from gdn_operator.handlers.core import kube

    crashwatch.handle_death(rt, "ns", "s", death("a", 1, "2026-11-22T10:00:01Z"))
    status = server.obj["status"]
    cl, d = st.get_condition(status, st.CRASH_LOOPING), st.get_condition(status, st.DEGRADED)
    assert (cl["status"], cl["reason"]) == ("False", "EngineCrashed")  # one crash: not a loop
    assert (d["status"], d["reason"]) == ("True", "EngineCrashed") and "engine in pod a died" in d["message"]
    assert quiet.clear_crash_conditions(rt.servers, "ns", "s", quiet_seconds=1.0) is server.obj
    assert st.is_true(server.obj["status"], st.DEGRADED)  # not Ready: a crash loop has ready phases, wait for one
    st.set_condition(server.obj["status"], st.READY, True, "EnginesReady", "1/1 engine pods ready.", 1)
    quiet.clear_crash_conditions(rt.servers, "ns", "s", quiet_seconds=1.0)  # the crash is long past
    status = server.obj["status"]
    assert st.get_condition(status, st.CRASH_LOOPING)["reason"] == "EnginesRunning" and not st.crash_recent(status)
    assert st.get_condition(status, st.DEGRADED)["status"] == "False"
    # a crash after a recent one is not cleared before its quiet period
    crashwatch.handle_death(rt, "ns", "s", death("a", 2, kube.now()))
    quiet.clear_crash_conditions(rt.servers, "ns", "s", quiet_seconds=600.0)
    assert st.crash_recent(server.obj["status"]) and st.is_true(server.obj["status"], st.DEGRADED)
