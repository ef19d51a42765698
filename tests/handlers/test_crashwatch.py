"""Pure parts of the crash watch: which deaths a pod shows, and which spec change a remedy means."""

import pytest

from gdn_operator.api.load import parse_spec
from gdn_operator.handlers.crashwatch import _merged_spec, deaths_in, remediation_for

BASE = {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}


def pod(**cs):
    return {"metadata": {"name": "p", "uid": "u1"}, "status": {"containerStatuses": [{"name": "vllm", **cs}]}}


def test_last_and_current_termination_share_one_key():
    # Before the kubelet restarts it: state.terminated with restartCount 2 → the 3rd death.
    now = deaths_in(pod(restartCount=2, state={"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}))
    # After the restart the same death shows as lastState with restartCount 3.
    later = deaths_in(pod(restartCount=3, state={"running": {}}, lastState={"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}))
    assert [d.restart_count for d in now] == [3] == [d.restart_count for d in later]
    assert now[0].message == "boom" and now[0].exit_code == 1


def test_clean_exit_and_other_containers_are_not_deaths():
    assert deaths_in(pod(restartCount=0, state={"terminated": {"exitCode": 0, "reason": "Completed"}})) == []
    p = pod(restartCount=1, lastState={"terminated": {"exitCode": 1}})
    p["status"]["containerStatuses"][0]["name"] = "sidecar"
    assert deaths_in(p) == []


def test_crash_loop_backoff_is_flagged():
    d = deaths_in(pod(restartCount=4, state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState={"terminated": {"exitCode": 1}}))
    assert d[0].crash_loop


@pytest.mark.parametrize(
    "action, spec, patch",
    [
        ("disable-async-scheduling", {}, {"asyncScheduling": False}),
        ("disable-async-scheduling", {"asyncScheduling": False}, None),  # already applied: never again
        ("disable-spec-decode", {}, {"speculativeDecoding": {"enabled": False}}),
        ("lower-num-speculative-tokens", {"speculativeDecoding": {"numSpeculativeTokens": 5}}, {"speculativeDecoding": {"numSpeculativeTokens": 4}}),
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
    merged = _merged_spec({"speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 5}, "replicas": 2},
                          {"speculativeDecoding": {"numSpeculativeTokens": 4}})
    assert merged == {"speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 4}, "replicas": 2}


class FakeServer:
    """Stands in for the API server in handle_death: status read-modify-write on one object."""

    def __init__(self, spec):
        self.obj = {"metadata": {"name": "s", "namespace": "ns", "generation": 1}, "spec": spec, "status": {}}
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
    from gdn_operator.handlers import crashwatch, kube

    fake = FakeServer({**BASE, "remediation": {"mode": "none"}})
    monkeypatch.setattr(kube, "update_status", fake.update_status)
    monkeypatch.setattr(kube, "emit_event", fake.emit_event)
    monkeypatch.setattr(crashwatch, "SEEN", crashwatch._Seen())  # a fresh operator process
    return fake


def death(pod, restarts, finished, args=()):
    from gdn_operator.handlers.crashwatch import Death

    return Death(pod, f"uid-{pod}", "vllm", restarts, 1, "Error", "AssertionError: num_decodes: 1, num_spec_decodes: 4",
                 finished, False, tuple(args))


def test_replayed_deaths_after_an_operator_restart_are_not_counted_again(server, monkeypatch):
    from gdn_operator.handlers import crashwatch

    crashwatch.handle_death("ns", "s", death("a", 1, "2026-11-22T10:00:01Z"))
    crashwatch.handle_death("ns", "s", death("b", 1, "2026-11-22T10:00:05Z"))
    assert server.obj["status"]["lastCrash"]["count"] == 2
    monkeypatch.setattr(crashwatch, "SEEN", crashwatch._Seen())  # operator restarted: kopf lists the pods again
    crashwatch.handle_death("ns", "s", death("a", 1, "2026-11-22T10:00:01Z"))
    crashwatch.handle_death("ns", "s", death("b", 1, "2026-11-22T10:00:05Z"))
    assert server.obj["status"]["lastCrash"]["count"] == 2
    assert server.events.count("EngineCrashed") == 2


def test_crash_of_a_pod_running_a_previous_spec_is_reported_but_not_counted(server, monkeypatch):
    from gdn_operator.handlers import crashwatch

    monkeypatch.setattr(crashwatch, "_current_args", lambda obj: {("current",)})  # every argv the workload runs
    crashwatch.handle_death("ns", "s", death("new", 1, "2026-11-22T10:00:01Z", args=("current",)))
    crashwatch.handle_death("ns", "s", death("old", 3, "2026-11-22T10:00:02Z", args=("previous",)))
    lc = server.obj["status"]["lastCrash"]
    assert lc["pod"] == "old" and lc["count"] == 1
