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
