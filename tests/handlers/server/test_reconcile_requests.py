"""What one reconcile asks of the API server (issue 11 part 8: the burst of 500 creates was bound by the API
server's CPU, 15.6-18.8 requests per server): one guarded status patch from the body kopf delivered, no read
of the workload before server-side apply, prune reads only for kinds the server recorded, one Event per
transition. A stand-in API server applies the JSON patches the way kube-apiserver does (RFC 6902 `test`
fails the whole patch with 422), so a concurrent status change is detected, not overwritten; the real one
runs in tests/integration (test_status_events.py, test_operator_reconcile.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator.handlers.core import kube

from gdn_operator.handlers.server import reconcile

from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core.kube import changed_by_apply
from gdn_operator.handlers.core.statusguard import status_patch
from runtime_helpers import make_runtime

from builders import GMS

# asyncScheduling set by the user: vllm#51508 is then a warning (unset, it resolves to off)
SERVER = GMS().uid("u1").generation(1).meta(resourceVersion="10").small().update(asyncScheduling=True)


class Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj).encode()

    def release_conn(self) -> None:
        pass


def go_text(value: Any) -> str:
    """How kube-apiserver writes a stored value before its JSON patch `test` compares texts: Go's encoder
    (non-ASCII raw, <, > and & escaped, an integral float without a fraction)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{go_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(go_text(v) for v in value) + "]"
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class ApiServer:
    """One GDNModelServer held as kube-apiserver would: resourceVersion bumped on each write, JSON patches of
    the status subresource applied atomically (a failed `test` changes nothing and answers 422)."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = copy.deepcopy(obj)
        self.requests: list[str] = []

    def __call__(self, _client: Any) -> ApiServer:  # stands in for kubernetes.client.CustomObjectsApi(c)
        return self

    def bump(self) -> None:
        self.obj["metadata"]["resourceVersion"] = str(int(self.obj["metadata"]["resourceVersion"]) + 1)

    def get_namespaced_custom_object(self, *_a: Any, **_kw: Any) -> dict[str, Any]:
        self.requests.append("GET server")
        return copy.deepcopy(self.obj)

    def patch_namespaced_custom_object_status(self, group, version, ns, plural, name, ops, **kw):  # noqa: ANN001
        self.requests.append("PATCH server/status")
        assert kw["_content_type"] == "application/json-patch+json"
        new = copy.deepcopy(self.obj)
        for op in ops:
            parts = op["path"].strip("/").split("/")
            parent = new
            for p in parts[:-1]:
                parent = parent[p]
            key = parts[-1]
            if op["op"] == "test":
                if key not in parent or go_text(parent[key]) != json.dumps(op["value"], sort_keys=True, separators=(",", ":")):
                    # what kube-apiserver 1.35 answers (no word of which test failed)
                    raise ApiException(status=422, reason="Unprocessable Entity") from None
            elif op["op"] == "add":
                parent[key] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[key]
        new["metadata"]["resourceVersion"] = self.obj["metadata"]["resourceVersion"]
        self.obj = new
        self.bump()
        return Response(self.obj)


@pytest.fixture
def api(monkeypatch):
    server = ApiServer(SERVER.obj())
    server.applied: list[str] = []
    server.events: list[tuple[str, str, str]] = []
    server.workload_changes = True
    monkeypatch.setattr(kube, "api_client", lambda: None)
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", server)
    server.same_rendering: list[tuple[str, bool]] = []

    def apply_changed(obj: dict[str, Any], *, same_rendering: bool = False) -> tuple[dict[str, Any], bool]:
        server.applied.append(obj["kind"])
        server.same_rendering.append((obj["kind"], same_rendering))
        return obj, server.workload_changes

    monkeypatch.setattr(kube, "apply_changed", apply_changed)
    monkeypatch.setattr(kube, "emit_event", lambda obj, reason, msg, type_="Normal": server.events.append((reason, msg, type_)))

    def deleted(kind, ns, name, uid, crds):  # noqa: ANN001
        server.requests.append(f"GET+DELETE {kind}")
        return kind == "HorizontalPodAutoscaler"

    monkeypatch.setattr(kube, "delete_owned", deleted)
    for read in ("get_object", "get_deployment"):
        monkeypatch.setattr(kube, read, lambda *a, _r=read: server.requests.append(f"{_r} {a[0]}"))
    return server


def test_a_new_server_costs_one_status_patch_no_read_and_one_event(api, rt):
    assert reconcile.reconcile_sync(copy.deepcopy(api.obj), rt) == "applied"
    assert api.requests == ["PATCH server/status"]  # no GET of the server, the Deployment or any pruned kind
    assert api.applied == ["Deployment", "Service", "PodDisruptionBudget"]
    status = api.obj["status"]
    assert status["observedGeneration"] == 1
    assert status["ownedKinds"] == ["Deployment", "PodDisruptionBudget"] and status["workload"] == "Deployment"
    assert st.get_condition(status, st.VALIDATED)["reason"] == "AdmittedWithWarnings"
    assert st.get_condition(status, st.OUTPUT_CONSISTENT)["reason"] == "ProbesDisabled"  # probes.mark_disabled folded in
    # one Event for the transition: Applied, carrying the known issues the KnownIssueWarning Event used to
    [(reason, msg, type_)] = api.events
    assert reason == "Applied" and type_ == "Warning"
    assert msg.startswith("Deployment, Service and PodDisruptionBudget applied for generation 1.") and "vllm#51508" in msg


def test_a_resumed_reconcile_of_an_unchanged_server_writes_and_emits_nothing(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    api.requests.clear()
    api.events.clear()
    api.workload_changes = False  # server-side apply answered a no-op
    assert reconcile.reconcile_sync(copy.deepcopy(api.obj), rt) == "unchanged"
    assert api.requests == [] and api.events == []


def test_the_status_records_the_rendering_so_a_reapply_of_it_is_judged_without_slack(api, rt):
    """A restart right after an apply: the workload's apply is flagged as the same rendering (kube.changed_by_apply
    then gives no second of slack, which would read the previous apply as a change); a new rendering is not."""
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    digest = api.obj["status"]["renderedDigest"]
    assert len(digest) == 32 and api.same_rendering[0] == ("Deployment", False)
    api.same_rendering.clear()
    api.requests.clear()
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    assert api.same_rendering == [("Deployment", True), ("Service", False), ("PodDisruptionBudget", False)]
    assert api.obj["status"]["renderedDigest"] == digest and api.requests == []  # nothing new to write
    api.same_rendering.clear()
    api.obj["metadata"]["generation"] = 2
    api.obj["spec"]["maxModelLen"] = 4096  # a new rendering
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    assert api.same_rendering[0] == ("Deployment", False)
    assert api.obj["status"]["renderedDigest"] != digest


def test_a_new_generation_with_the_same_workload_emits_its_findings_once(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    api.events.clear()
    api.obj["metadata"]["generation"] = 2  # e.g. A → B → A coalesced by kopf: converge_generation reconciles
    api.workload_changes = False
    assert reconcile.reconcile_sync(copy.deepcopy(api.obj), rt) == "unchanged"
    assert [e[0] for e in api.events] == ["KnownIssueWarning"]
    assert api.obj["status"]["observedGeneration"] == 2


def test_kopfs_own_patch_in_between_costs_no_read(api, rt):
    body = copy.deepcopy(api.obj)
    api.obj["metadata"]["annotations"] = {"kopf.serving.gdn-operator.io/last-handled-configuration": "{}"}
    api.bump()  # the body kopf delivered is one resourceVersion behind; its status is not
    reconcile.reconcile_sync(body, rt)
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)  # status exists now: guarded per key, not by version
    api.requests.clear()
    body = copy.deepcopy(api.obj)
    api.obj["metadata"]["annotations"]["x"] = "y"
    api.bump()
    body["metadata"]["generation"] = api.obj["metadata"]["generation"] = 2
    reconcile.reconcile_sync(body, rt)
    assert api.requests == ["PATCH server/status"]
    assert api.obj["status"]["observedGeneration"] == 2


def test_findings_with_non_ascii_text_are_rewritten_under_the_version_and_kept_current(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    assert any("\u2014" in f["message"] or ">=" in f["message"] for f in api.obj["status"]["findings"])
    body = copy.deepcopy(api.obj)
    body["metadata"]["generation"] = api.obj["metadata"]["generation"] = 2
    body["spec"]["tensorParallelSize"] = api.obj["spec"]["tensorParallelSize"] = 2
    api.requests.clear()
    reconcile.reconcile_sync(body, rt)  # findings text is not comparable by the API server: guarded by version
    assert api.requests == ["PATCH server/status"]
    assert api.obj["status"]["observedGeneration"] == 2


def test_a_condition_written_since_the_body_was_delivered_is_kept(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    body = copy.deepcopy(api.obj)
    body["metadata"]["generation"] = api.obj["metadata"]["generation"] = 2
    # the workload's handler writes Ready meanwhile (its own status write)
    status = copy.deepcopy(api.obj["status"])
    st.set_replicas(status, 1, 1, 1)
    st.set_condition(status, st.READY, True, "EnginesReady", "1/1 engine pods ready.", 1)
    api.obj["status"] = status
    api.bump()
    reconcile.reconcile_sync(body, rt)
    assert api.requests[-3:] == ["PATCH server/status", "GET server", "PATCH server/status"]  # refused, read, again
    final = api.obj["status"]
    assert st.is_true(final, st.READY) and final["readyReplicas"] == 1
    assert final["observedGeneration"] == 2 and st.get_condition(final, st.VALIDATED)["observedGeneration"] == 2


def test_prune_asks_only_about_the_kinds_the_server_recorded(api, rt):
    api.obj["status"] = {"observedGeneration": 1, "ownedKinds": ["Deployment", "HorizontalPodAutoscaler"]}
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)  # the spec renders no autoscaler any more
    assert [r for r in api.requests if r.startswith("GET+DELETE")] == ["GET+DELETE HorizontalPodAutoscaler"]
    assert api.obj["status"]["ownedKinds"] == ["Deployment", "PodDisruptionBudget"]  # recorded again once deleted
    api.requests.clear()
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    assert not [r for r in api.requests if r.startswith("GET")]


def test_a_server_an_older_operator_reconciled_is_pruned_over_every_enabled_kind(api):
    rt = make_runtime(lws=False, inference_pool=False, hpa=True, keda_prometheus_address="")
    api.obj["status"] = {"observedGeneration": 1}  # no ownedKinds: written before they were recorded
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    asked = [r.split()[1] for r in api.requests if r.startswith("GET+DELETE")]
    # every kind the settings enable (the chart grants RBAC for) but those rendered (Deployment, PodDisruptionBudget)
    assert asked == ["HorizontalPodAutoscaler", "PersistentVolumeClaim"]
    assert api.obj["status"]["ownedKinds"] == ["Deployment", "PodDisruptionBudget"]


def test_status_patch_writes_changed_keys_guarded_by_what_they_were_computed_from():
    old = {
        "observedGeneration": 1,
        "readyReplicas": 0,
        "conditions": [{"type": "Validated", "status": "True"}],
        "phase": "Progressing",
        "acceptance": {"rate": 0.5},
        "probes": {"state": "x"},
    }
    new = {**old, "observedGeneration": 2, "conditions": [{"type": "Validated", "status": "False"}], "phase": "Rejected"}
    del new["probes"]
    ops = status_patch(old, new, "7")
    assert {"op": "test", "path": "/status/readyReplicas", "value": 0} in ops  # the phase derives from it
    assert {"op": "test", "path": "/status/conditions", "value": old["conditions"]} in ops
    assert {"op": "remove", "path": "/status/probes"} in ops
    assert not any(o["path"] == "/status/acceptance" for o in ops)  # unchanged: neither written nor tested
    assert not any(o["path"] == "/metadata/resourceVersion" for o in ops)
    # what kube-apiserver would not find equal to itself (its test compares Go's JSON text): the version instead
    for text in ("x \u2014 y", "affects >=0.18.0", "a & b"):
        guarded = status_patch({**old, "ready": text}, {**old, "ready": "1/1"}, "7")
        assert guarded[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}, text
        assert [o["op"] for o in guarded] == ["test", "add"]
    assert (
        status_patch({**old, "acceptance": {"rate": 0.5}}, {**old, "acceptance": {"rate": 0.6}}, "7")[0]["path"]
        == "/metadata/resourceVersion"
    )
    # a key added now cannot be tested for absence: the whole object's version guards the write instead
    added = status_patch(old, {**old, "lastCrash": {"count": 1}}, "7")
    assert added[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert status_patch({}, {"phase": "Pending"}, "7") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/status", "value": {"phase": "Pending"}},
    ]


def test_changed_by_apply_reads_the_managers_field_time_against_the_response_date():
    def applied(time: str | None) -> dict[str, Any]:
        return {
            "metadata": {
                "managedFields": [
                    {"manager": "kube-controller-manager", "operation": "Update", "time": "2026-11-23T18:00:09Z"},
                    {"manager": kube.FIELD_MANAGER, "operation": "Apply", "time": time},
                ]
            }
        }

    date = "Mon, 23 Nov 2026 18:00:10 GMT"
    assert changed_by_apply(applied("2026-11-23T18:00:10Z"), date)
    assert changed_by_apply(applied("2026-11-23T18:00:09Z"), date)  # one second of slack (whole seconds)
    assert not changed_by_apply(applied("2026-11-23T17:59:00Z"), date)  # a no-op apply left the time alone
    assert changed_by_apply(applied(None), date) and changed_by_apply(applied("2026-11-23T17:59:00Z"), None)
    # the same rendering re-applied: no slack, so an apply of a second ago (before an operator restart) is no change
    assert not changed_by_apply(applied("2026-11-23T18:00:09Z"), date, same_rendering=True)
    assert changed_by_apply(applied("2026-11-23T18:00:10Z"), date, same_rendering=True)  # someone else's change undone


def test_a_status_the_schema_refuses_is_an_error_not_a_conflict(api, monkeypatch):
    def refuse(*_a, **_kw):
        api.requests.append("PATCH server/status")
        raise ApiException(status=422, reason="Unprocessable Entity")

    monkeypatch.setattr(api, "patch_namespaced_custom_object_status", refuse)
    api.obj["status"] = {"phase": "Pending"}
    with pytest.raises(ApiException):
        statusguard.update_status(
            "ns", "s", lambda status, _o: status.__setitem__("phase", "x" * 100), obj=copy.deepcopy(api.obj)
        )
    assert api.requests == ["PATCH server/status", "GET server"]  # read once to tell, not retried 8 times


def test_a_status_that_keeps_moving_is_read_again_then_the_conflict_is_raised(api, monkeypatch):
    def conflict(*_a, **_kw):
        api.requests.append("PATCH server/status")
        api.bump()
        raise ApiException(status=409, reason="Conflict")

    monkeypatch.setattr(api, "patch_namespaced_custom_object_status", conflict)
    with pytest.raises(ApiException) as e:
        statusguard.update_status(
            "ns", "s", lambda status, _o: status.__setitem__("phase", "x"), retries=3, obj=copy.deepcopy(api.obj)
        )
    assert e.value.status == 409
    assert api.requests == ["PATCH server/status", "GET server"] * 2 + ["PATCH server/status"]


def test_retrying_numbers_the_attempts_and_raises_the_last_error_or_any_other_at_once():
    seen: list[int] = []

    def moving(n: int) -> str:
        seen.append(n)
        raise kube.Retry(ApiException(status=409, reason=f"Conflict {n}"))

    with pytest.raises(ApiException, match="Conflict 3"):
        kube.retrying(moving, 4)
    assert seen == [0, 1, 2, 3]

    def lands_third(n: int) -> int:
        if n < 2:
            raise kube.Retry(ValueError("moved"))
        return n

    assert kube.retrying(lands_third, 5) == 2

    def broken(n: int) -> str:
        seen.append(n)
        raise KeyError("not a conflict")

    seen.clear()
    with pytest.raises(KeyError):
        kube.retrying(broken, 4)
    assert seen == [0]


# ------------------------------------- issue 29 part 9: a workload event asks nothing it already knows ---

from gdn_operator.handlers.server import workload  # noqa: E402
from gdn_operator.handlers.core.servers import Servers  # noqa: E402
from gdn_operator.handlers.core.plan import expected_objects  # noqa: E402
from gdn_operator.render.scaleout import workload_of  # noqa: E402


def rendered_workload(api: ApiServer, rt: Any, **status: Any) -> dict[str, Any]:
    """The engine Deployment as the API server's watch delivers it: what the server's spec renders, plus
    the status the Deployment controller has written (none yet for a new one)."""
    dep = copy.deepcopy(workload_of(expected_objects(copy.deepcopy(api.obj), rt)))
    return {**dep, "status": status} if status else dep


def test_the_new_workloads_first_event_costs_no_request(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    written = copy.deepcopy(api.obj["status"])
    assert st.get_condition(written, st.READY)["reason"] == "EnginesNotReady"  # in the reconcile's one write
    assert st.get_condition(written, st.PROGRESSING)["reason"] == "RollingOut"
    api.requests.clear()
    workload.on_deployment(rt, "ns", "s", rendered_workload(api, rt), owner_uid="u1")
    assert api.requests == [] and api.obj["status"] == written  # no read of the server, nothing to write


def test_a_workload_event_with_news_is_one_patch_from_the_body_seen(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    api.requests.clear()
    dep = rendered_workload(api, rt, replicas=1, readyReplicas=1, updatedReplicas=1)
    workload.on_deployment(rt, "ns", "s", dep, owner_uid="u1")
    assert api.requests == ["PATCH server/status"]
    assert st.is_true(api.obj["status"], st.READY) and api.obj["status"]["phase"] == "Ready"


def test_a_workload_event_from_a_stale_body_is_read_again_not_overwritten(api, rt):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    status = copy.deepcopy(api.obj["status"])  # someone else's write the operator has not seen yet
    st.set_condition(status, st.CRASH_LOOPING, True, "RepeatedCrash", "B1 three times", 1)
    api.obj["status"] = status
    api.bump()
    api.requests.clear()
    dep = rendered_workload(api, rt, replicas=1, readyReplicas=1, updatedReplicas=1)
    workload.on_deployment(rt, "ns", "s", dep, owner_uid="u1")
    assert api.requests == ["PATCH server/status", "GET server", "PATCH server/status"]  # refused, read, again
    final = api.obj["status"]
    assert st.is_true(final, st.CRASH_LOOPING) and st.is_true(final, st.READY) and final["phase"] == "CrashLooping"


def test_drift_is_judged_against_a_fresh_read_before_anything_is_reapplied(api, rt, monkeypatch):
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    reapplied: list[str] = []
    monkeypatch.setattr(kube, "apply", lambda obj: reapplied.append(obj["kind"]) or obj)
    api.requests.clear()
    edited = rendered_workload(api, rt)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
    planned: list[int] = []
    expected = workload.expected_objects
    monkeypatch.setattr(workload, "expected_objects", lambda body, inputs: planned.append(1) or expected(body, inputs))
    workload.on_deployment(rt, "ns", "s", edited, owner_uid="u1")
    assert api.requests[0] == "GET server" and reapplied == ["Deployment"]
    assert len(planned) == 1  # planned once: the fresh read has the same generation and overrides (issue 37)
    api.requests.clear()
    workload.on_deployment(rt, "ns", "s", None, owner_uid="u1")  # deleted: also confirmed by a read first
    assert api.requests[0] == "GET server" and reapplied == ["Deployment", "Deployment"]
    # a fresh read that shows a new generation is planned again
    api.obj["metadata"]["generation"] = 2
    api.bump()
    planned.clear()
    workload.on_deployment(rt, "ns", "s", edited, owner_uid="u1")
    assert len(planned) == 2


def test_server_bodies_keep_the_newest_version_of_the_same_object():
    bodies = Servers()
    meta = {"namespace": "ns", "name": "s", "uid": "u1", "managedFields": [{"manager": "x"}]}
    bodies.put({"metadata": {**meta, "resourceVersion": "12"}, "status": {"n": 12}})
    bodies.put({"metadata": {**meta, "resourceVersion": "11"}, "status": {"n": 11}})  # a late, older event
    got = bodies.get("ns", "s")
    assert got is not None and got["status"] == {"n": 12} and "managedFields" not in got["metadata"]
    got["status"]["n"] = 0  # a copy: the caller's edits stay the caller's
    assert bodies.get("ns", "s", "u1")["status"] == {"n": 12}
    assert bodies.get("ns", "s", "u2") is None  # asked for a re-created object of the same name
    bodies.put({"metadata": {**meta, "uid": "u2", "resourceVersion": "3"}, "status": {"n": 3}})  # re-created
    assert bodies.get("ns", "s", "u2")["status"] == {"n": 3}
    bodies.forget("ns", "s")
    assert bodies.get("ns", "s") is None


def test_a_workload_event_during_the_operators_own_apply_is_not_drift(api, rt, monkeypatch):
    """The status is written before the workload is applied; a Deployment event seen in between (the Deployment
    controller's status of the old workload, or a crashed pod's) shows the old workload against the new status. That
    is the operator's apply in flight: no fresh read of the server, no re-apply, no DriftCorrected Event (seen as a
    second GET of one remediated crash in tests/integration/test_crashwatch_cluster.py under load)."""
    reconcile.reconcile_sync(copy.deepcopy(api.obj), rt)
    old = rendered_workload(api, rt, replicas=1, readyReplicas=1, updatedReplicas=1)
    api.obj["spec"]["image"] = {**api.obj["spec"].get("image", {}), "tag": "v0.33.1"}
    api.obj["metadata"]["generation"] = 2
    api.bump()
    reapplied: list[str] = []
    monkeypatch.setattr(kube, "apply", lambda obj: reapplied.append(obj["kind"]) or obj)
    seen: list[list[str]] = []
    applying = kube.apply_changed

    def apply_changed(obj: dict[str, Any], *, same_rendering: bool = False) -> tuple[dict[str, Any], bool]:
        if obj["kind"] == "Deployment":  # the old workload's event, handled while the new one is being applied
            before = len(api.requests)
            workload.on_deployment(rt, "ns", "s", copy.deepcopy(old), owner_uid="u1")
            seen.append(api.requests[before:])
        return applying(obj, same_rendering=same_rendering)

    monkeypatch.setattr(kube, "apply_changed", apply_changed)
    api.events.clear()
    assert reconcile.reconcile_sync(copy.deepcopy(api.obj), rt) == "applied"
    assert seen and all("GET server" not in requests for requests in seen), seen
    assert reapplied == [] and not [e for e in api.events if e[0] == "DriftCorrected"]
    # after the apply, the same old workload is drift again: judged against a fresh read and re-applied
    api.requests.clear()
    workload.on_deployment(rt, "ns", "s", copy.deepcopy(old), owner_uid="u1")
    assert api.requests[0] == "GET server" and reapplied == ["Deployment"]
