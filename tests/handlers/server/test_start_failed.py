"""Issue 38 item 3: a pod that cannot start because its image cannot be pulled or its model download fails
reaches status as StartFailed (reason ImagePullFailed / ModelDownloadFailed, the kubelet's message or the
download step's last words), degrades the server, gets one Warning Event, and clears once the pods start."""

import pytest

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube as kube_mod
from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.server import workload as wl
from gdn_operator.handlers.core.pods import IMAGE_PULL_FAILED, MODEL_DOWNLOAD_FAILED, pod_summary, start_failure

from builders import EnginePod

GATED = (
    "gdn-operator: hf download Qwen/Qwen3.5-27B\n401 Client Error. Cannot access gated repo for url "
    "https://huggingface.co/api/models/Qwen/Qwen3.5-27B. Access to model Qwen/Qwen3.5-27B is restricted.\n"
    "gdn-operator: download of Qwen/Qwen3.5-27B failed (see the lines above)"
)
PULL = 'Back-off pulling image "ghcr.io/gdn-operator/vllm-gdn:v0.33.0-gdn9"'


def test_download_failure_while_the_kubelet_retries_it():
    running_again = EnginePod().init_container(
        state={"running": {}}, lastState=EnginePod.terminated(1, "Error", GATED), restartCount=2
    )
    reason, message = start_failure(running_again.obj()["status"])
    assert reason == MODEL_DOWNLOAD_FAILED and "Cannot access gated repo" in message and message.startswith("model-download:")
    backoff = EnginePod().init_container(
        state=EnginePod.waiting("CrashLoopBackOff"), lastState=EnginePod.terminated(1, "Error", GATED)
    )
    assert start_failure(backoff.obj()["status"])[0] == MODEL_DOWNLOAD_FAILED
    # the last attempt succeeded: no failure, whatever came before
    done = EnginePod().init_container(
        state=EnginePod.terminated(0, "Completed"), lastState=EnginePod.terminated(1, "Error", GATED)
    )
    assert start_failure(done.obj()["status"]) is None
    assert start_failure(EnginePod().init_container(state={"running": {}}).obj()["status"]) is None
    # an init container of the user's that fails is not a model download
    other = EnginePod().init_container("istio-init", lastState=EnginePod.terminated(1, "Error", "iptables"))
    assert start_failure(other.obj()["status"]) is None


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_image_pull_failure_of_the_engine_or_the_download_step(reason):
    engine = EnginePod().container(state=EnginePod.waiting(reason, PULL))
    got = start_failure(engine.obj()["status"])
    assert got == (IMAGE_PULL_FAILED, f"vllm: {reason}: {PULL}")
    init = EnginePod().init_container(state=EnginePod.waiting(reason, PULL))
    assert start_failure(init.obj()["status"])[0] == IMAGE_PULL_FAILED
    assert pod_summary(engine.uid("u").obj())["start_failure"] == got


def test_download_message_is_bounded_to_its_end():
    long = "x" * 5000 + " 429 Too Many Requests"
    pod = EnginePod().init_container(lastState=EnginePod.terminated(1, "Error", long), state={"running": {}})
    _, message = start_failure(pod.obj()["status"])
    assert message.endswith("429 Too Many Requests") and len(message) < 700


@pytest.fixture
def server(monkeypatch):
    server = {"metadata": {"name": "s", "namespace": "ns", "generation": 1}, "spec": {}, "status": {}}
    events = []

    def update(ns, n, mutate, obj=None, **kw):
        mutate(server["status"], server)
        return server

    monkeypatch.setattr(statusguard, "update_status", update)
    monkeypatch.setattr(
        kube_mod, "emit_event", lambda obj, reason, message, type_="Normal": events.append((type_, reason, message))
    )
    server["events"] = events
    return server


def summary(pod):
    return pod_summary(pod.server("s").uid("u").obj())


def test_start_failed_condition_degraded_event_and_recovery(server):
    failing = summary(EnginePod("s-0").init_container(state={"running": {}}, lastState=EnginePod.terminated(1, "Error", GATED)))
    wl.update_from_pods("ns", "s", [failing, summary(EnginePod("s-1"))], Servers())
    cond = st.get_condition(server["status"], st.START_FAILED)
    assert (cond["status"], cond["reason"]) == ("True", MODEL_DOWNLOAD_FAILED)
    assert cond["message"].startswith("1 engine pod(s) cannot start (s-0: model-download:") and "gated repo" in cond["message"]
    assert st.get_condition(server["status"], st.DEGRADED)["reason"] == MODEL_DOWNLOAD_FAILED
    assert server["events"] == [("Warning", MODEL_DOWNLOAD_FAILED, cond["message"])]

    wl.update_from_pods("ns", "s", [failing], Servers())  # the same failure again: no second Event
    assert len(server["events"]) == 1

    pulling = summary(EnginePod("s-0").container(state=EnginePod.waiting("ImagePullBackOff", PULL)))
    wl.update_from_pods("ns", "s", [pulling], Servers())  # another cause: its own Event
    assert st.get_condition(server["status"], st.START_FAILED)["reason"] == IMAGE_PULL_FAILED
    assert [e[1] for e in server["events"]] == [MODEL_DOWNLOAD_FAILED, IMAGE_PULL_FAILED]

    wl.update_from_pods("ns", "s", [summary(EnginePod("s-0").ready())], Servers())
    cond = st.get_condition(server["status"], st.START_FAILED)
    assert (cond["status"], cond["reason"]) == ("False", "Started")
    assert st.get_condition(server["status"], st.DEGRADED)["status"] == "False"


def test_no_condition_for_pods_that_start(server):
    wl.update_from_pods("ns", "s", [summary(EnginePod("s-0").ready())], Servers())
    assert st.get_condition(server["status"], st.START_FAILED) is None and server["events"] == []
