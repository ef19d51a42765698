"""Crash watch on the real control plane: kwok makes the engine container die with a termination message
carrying a vLLM crash signature (tests/cluster/kwok/extra.yaml), and the operator must classify it into
status, an Event and a metric, and apply the documented remediation exactly once — as an operator-owned
override (status.overrides), never a spec write."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from operator_harness import apiserver_requests, gms, running_operator, wait_for

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def tail(name: str, limit: int = 2048) -> str:
    """What the kubelet puts in the termination message (FallbackToLogsOnError: last 2048 bytes)."""
    data = (LOGS / name).read_bytes()[-limit:]
    return data.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-crash")) as proc:
        yield proc


def running_pod(k, ns, name):
    def one():
        pods = [p for p in k.engine_pods(ns, name) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return pods[0] if len(pods) == 1 else None

    return wait_for(one, 90, what=f"one running engine pod of {name}")


def crash(k, ns, pod_name, message, exit_code=1):
    """Make kwok kill and restart the engine container with `message` as its termination message.
    Returns when the restart is visible, or when the pod is already being replaced (a remediation can
    roll the Deployment faster than this poll sees the restart)."""
    from kubernetes.client.rest import ApiException

    before = k.core.read_namespaced_pod(pod_name, ns).status.container_statuses[0].restart_count or 0
    k.core.patch_namespaced_pod(
        pod_name,
        ns,
        {
            "metadata": {
                "annotations": {
                    "gdn-operator.io/test-crash-message": message,
                    "gdn-operator.io/test-crash-exit-code": str(exit_code),
                }
            }
        },
    )

    def restarted_or_replaced():
        try:
            p = k.core.read_namespaced_pod(pod_name, ns)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return p.metadata.deletion_timestamp is not None or (p.status.container_statuses[0].restart_count or 0) > before

    wait_for(restarted_or_replaced, 30, what=f"kwok restarted the container of {pod_name}")
    return before + 1


def test_known_crash_reported_in_status_event_and_metric(op, k, ns):
    k.create(ns, gms("b1", remediation={"mode": "none"}))
    pod = running_pod(k, ns, "b1")
    t0 = time.monotonic()
    restarts = crash(k, ns, pod.metadata.name, tail("b1-gdn-assert-tp2-interleaved.tail.log"))
    st = wait_for(
        lambda: (k.status(ns, "b1").get("lastCrash") or {}).get("restartCount") == restarts and k.status(ns, "b1"),
        30,
        what="status.lastCrash",
    )
    detect = time.monotonic() - t0
    lc = st["lastCrash"]
    assert lc["signature"] == "gdn-mixed-spec-decode-assert"
    assert lc["upstream"] == "vllm#36917"
    assert "num_decodes" in lc["rootCause"] and "num_spec_decodes" in lc["rootCause"]
    assert lc["pod"] == pod.metadata.name and lc["exitCode"] == 1 and lc["count"] == 1
    deg = k.condition(ns, "b1", "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "EngineCrashed"
    ev = wait_for(lambda: k.events(ns, "b1", "EngineCrashed"), 15, what="EngineCrashed event")
    assert "vllm#36917" in ev[0].message
    metric = (
        'gdn_engine_crashes_total{namespace="%s",server="b1",signature="gdn-mixed-spec-decode-assert",upstream="vllm#36917"} 1.0'
        % ns
    )
    assert metric in op.metrics()
    print(f"detection latency (annotation → restart → status): {detect:.2f}s")

    # A second crash of the same kind is counted, and marks the server CrashLooping; remediation is off.
    crash(k, ns, pod.metadata.name, tail("b1-gdn-assert-tp2-interleaved.tail.log"))
    wait_for(lambda: k.status(ns, "b1")["lastCrash"]["count"] == 2, 30, what="second crash counted")
    k.wait_condition(ns, "b1", "CrashLooping")
    assert k.status(ns, "b1")["phase"] == "CrashLooping"
    assert not k.status(ns, "b1").get("remediations")


def test_unknown_crash_still_yields_engine_dead_with_root_cause(op, k, ns):
    k.create(ns, gms("unknown"))
    pod = running_pod(k, ns, "unknown")
    crash(k, ns, pod.metadata.name, tail("unknown-crash-keyerror.tail.log"))
    lc = wait_for(lambda: k.status(ns, "unknown").get("lastCrash"), 30, what="lastCrash")
    assert lc["signature"] in ("engine-dead", "unhandled-exception")
    assert lc.get("rootCause", "").startswith("KeyError")


def _git_apply(k, ns, obj):
    """Server-side apply by a second field manager, the way a GitOps controller (Argo CD, Flux) applies."""
    return k.co.patch_namespaced_custom_object(
        "serving.gdn-operator.io",
        "v1alpha1",
        ns,
        "gdnmodelservers",
        obj["metadata"]["name"],
        obj,
        field_manager="git",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def _git_entry(obj):
    """The managedFields entry of the "git" manager's applies (time + fields), or None."""
    entries = [m for m in obj["metadata"].get("managedFields") or [] if m["manager"] == "git" and m["operation"] == "Apply"]
    return [(m.get("time"), m.get("fieldsV1")) for m in entries] or None


def test_repeated_known_crash_is_remediated_exactly_once_as_an_override(op, k, ns):
    """Issue 23: a server applied from "Git" (server-side apply, manager git) goes through an admission mitigation
    and a crash-loop remediation; its .spec and generation never change, the Deployment carries both, status lists
    them; re-applying from Git changes nothing (no write ping-pong) and does not undo the remediation; the
    decision is made once per revision."""
    manifest = gms(
        "b9", remediation={"mode": "auto", "threshold": 3}, asyncScheduling=True, prefixCaching=True, admissionPolicy="mitigate"
    )
    manifest["metadata"]["namespace"] = ns
    _git_apply(k, ns, manifest)
    submitted = k.get(ns, "b9")["spec"]
    pod = running_pod(k, ns, "b9")
    dep_args = k.deployment(ns, "b9").spec.template.spec.containers[0].args
    assert "--no-enable-prefix-caching" in dep_args and "--async-scheduling" in dep_args  # mitigation as override
    message = tail("b9-np-repeat-negative.tail.log")
    for _ in range(3):
        crash(k, ns, pod.metadata.name, message)
    wait_for(
        lambda: "--no-async-scheduling" in k.deployment(ns, "b9").spec.template.spec.containers[0].args,
        45,
        what="the remediation rendered into the Deployment",
    )
    obj = k.get(ns, "b9")
    assert obj["spec"] == submitted and obj["metadata"]["generation"] == 1  # the spec is never written
    assert "serving.gdn-operator.io/last-remediation" not in (obj["metadata"].get("annotations") or {})
    rem = obj["status"]["remediations"]
    assert len(rem) == 1 and rem[0]["signature"] == "spec-decode-negative-repeat" and rem[0]["upstream"] == "vllm#53962"
    assert rem[0]["action"] == "asyncScheduling=false" and rem[0]["generation"] == 1
    ov = {o["path"]: o for o in obj["status"]["overrides"]}
    assert ov["asyncScheduling"]["value"] is False and ov["asyncScheduling"]["reason"] == "spec-decode-negative-repeat"
    assert ov["prefixCaching"]["value"] is False and ov["prefixCaching"]["reason"] == "vllm#43559"
    assert k.condition(ns, "b9", "Overridden")["status"] == "True"
    assert k.events(ns, "b9", "Remediated")
    assert (
        'gdn_remediations_total{action="asyncScheduling=false",namespace="%s",server="b9",signature="spec-decode-negative-repeat"} 1.0'
        % ns
        in op.metrics()
    )
    # only "git" owns spec fields; the operator owns the status subresource and kopf's own bookkeeping
    # annotation (kopf.serving.gdn-operator.io/*), nothing the user wrote
    for m in obj["metadata"]["managedFields"]:
        fields = m.get("fieldsV1") or {}
        if "f:spec" in fields:
            assert m["manager"] == "git", m["manager"]
        elif m["manager"] != "git" and m.get("subresource") != "status":
            assert set(fields) == {"f:metadata"} and set(fields["f:metadata"]) == {"f:annotations"}, m
            assert all(
                key == "." or key.startswith("f:kopf.serving.gdn-operator.io/") for key in fields["f:metadata"]["f:annotations"]
            ), m

    # GitOps re-syncs (bounded here: every 2 s for 20 s; the issue asks 30 s x 5 min, not run in the suite):
    # each apply is a no-op: the API server wrote nothing for it (its managedFields entry for "git" keeps the
    # time and fields of the first apply — a write by git would renew them; the resourceVersion alone cannot
    # tell, since the operator's status writes may land between the read and the apply), generation stays,
    # the remediation stays rendered
    noops = 0
    for _ in range(10):
        before = _git_entry(k.get(ns, "b9"))
        after = _git_entry(_git_apply(k, ns, manifest))
        assert before is not None, "the server was applied by the git manager"
        noops += before == after
        time.sleep(2)
    obj = k.get(ns, "b9")
    assert noops == 10 and obj["metadata"]["generation"] == 1 and obj["spec"] == submitted
    assert "--no-async-scheduling" in k.deployment(ns, "b9").spec.template.spec.containers[0].args

    # The same crash on the remediated engine counts on the new revision; the workaround is in place, so
    # nothing is changed again (no loop), once.
    def rolled_pod():
        pods = [p for p in k.engine_pods(ns, "b9") if not p.metadata.deletion_timestamp]
        if len(pods) == 1 and pods[0].status.phase == "Running" and "--no-async-scheduling" in pods[0].spec.containers[0].args:
            return pods[0]
        return None

    pod2 = wait_for(rolled_pod, 90, what="the remediated engine pod, alone")
    for _ in range(3):
        crash(k, ns, pod2.metadata.name, message)
    wait_for(lambda: k.events(ns, "b9", "RemediationNotPossible"), 30, what="RemediationNotPossible event")
    obj = k.get(ns, "b9")
    assert len([r for r in obj["status"]["remediations"] if r["changes"]]) == 1
    decided = obj["status"]["remediations"][1:]
    assert len(decided) == 1 and decided[0]["action"] == "none" and decided[0]["revision"] != rem[0]["revision"]
    crash(k, ns, pod2.metadata.name, message)
    wait_for(lambda: k.status(ns, "b9")["lastCrash"]["count"] == 4, 30, what="fourth crash counted")
    obj = k.get(ns, "b9")
    assert len(obj["status"]["remediations"]) == 2 and obj["metadata"]["generation"] == 1
    assert len(k.events(ns, "b9", "RemediationNotPossible")) == 1


def test_a_remediated_crash_reads_the_server_at_most_once(op, k, ns, full_cluster):
    """Issue 37: classifying the crash (its spec evidence), recording it, claiming the remediation, rendering the
    override and syncing the autoscaler all start from the newest body the operator holds (handlers/core/servers.py):
    one remediated crash reads the server at most once (it was up to 5 GETs: one per step). Counted at the API
    server (apiserver_request_total); the test itself waits with reads of pods and Deployments only.

    The one other read the door makes is on a status-write conflict: its guarded write (handlers/core/statusguard.py) is
    refused with 422 when another writer changed the status since the body it holds, and it must read the newest
    body then. The rollout the remediation starts sends Deployment events whose status writes can meet the crash
    watch's (a full run hit two such conflicts): each refused write is allowed its one read, no more."""
    k.create(ns, gms("r1", remediation={"mode": "auto", "threshold": 1}, asyncScheduling=True))
    pod = running_pod(k, ns, "r1")
    wait_for(lambda: (k.condition(ns, "r1", "Ready") or {}).get("status") == "True", 60, what="r1 Ready")

    def reads() -> float:
        return apiserver_requests(full_cluster).get("GET gdnmodelservers", 0.0)

    def conflicts() -> float:
        return apiserver_requests(full_cluster, code="422").get("PATCH gdnmodelservers/status", 0.0)

    before, conflicts_before = reads(), conflicts()
    crash(k, ns, pod.metadata.name, tail("b9-np-repeat-negative.tail.log"))
    wait_for(
        lambda: "--no-async-scheduling" in k.deployment(ns, "r1").spec.template.spec.containers[0].args,
        45,
        what="the remediation rendered into the Deployment",
    )
    during, refused = reads() - before, conflicts() - conflicts_before
    obj = k.get(ns, "r1")
    assert [r["action"] for r in obj["status"]["remediations"]] == ["asyncScheduling=false"]
    assert during <= 1 + refused, f"{during:.0f} reads of the server for one remediated crash ({refused:.0f} conflicts)"
