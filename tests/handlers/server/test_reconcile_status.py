"""reconcile.calculate_status: the reconcile's status as a pure function of the plan and the decision (issue 37
item 4; KubeRay's calculateStatus and LWS's updateStatus are the models): no request, the same answer for the
same input, and nothing left to write when run on its own result (the status write skips an unchanged status)."""

from __future__ import annotations

import copy

import pytest

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.server import reconcile
from gdn_operator.handlers.core.plan import plan
from gdn_operator.render.scaleout import workload_of

from builders import GMS


def _decide(body, rt):
    p = plan(body, rt)
    workload = workload_of(p.objects)
    gen = body["metadata"]["generation"]
    admitted = reconcile.Admitted(gen, "Admitted", "ok", ["Deployment"], workload, "d1", probes_off=True)
    return p, admitted


@pytest.fixture
def no_requests(monkeypatch):
    def refuse():
        raise AssertionError("calculate_status made a request")

    monkeypatch.setattr(kube, "api_client", refuse)


def test_the_status_of_a_new_server_is_calculated_without_a_request(rt, no_requests):
    body = GMS().uid("u1").generation(3).obj()
    p, admitted = _decide(body, rt)
    status: dict = {}
    assert reconcile.calculate_status(status, body, p, admitted) is True  # a new generation: news
    assert status["observedGeneration"] == 3 and status["ownedKinds"] == ["Deployment"] and status["renderedDigest"] == "d1"
    assert status["workload"] == "Deployment" and status["url"].startswith("http://")
    assert st.get_condition(status, st.VALIDATED)["reason"] == "Admitted"
    # a new workload: what its first event would say is in the same status (workloadstatus.workload_status)
    assert st.get_condition(status, st.PROGRESSING)["status"] == "True" and status["replicas"] == 1
    assert st.get_condition(status, st.OUTPUT_CONSISTENT)["reason"] == "ProbesDisabled"


def test_the_same_input_gives_the_same_status_and_its_result_is_a_fixed_point(rt, no_requests):
    body = GMS().uid("u1").generation(3).obj()
    p, admitted = _decide(body, rt)
    first: dict = {}
    reconcile.calculate_status(first, body, p, admitted)
    second: dict = {}
    reconcile.calculate_status(second, copy.deepcopy(body), p, admitted)
    assert first == second
    again = copy.deepcopy(first)
    written = {**body, "status": copy.deepcopy(first)}
    assert reconcile.calculate_status(again, written, p, admitted) is False  # nothing new: no log, no Event
    assert again == first  # and nothing to write


def test_a_later_generation_is_news_and_keeps_the_recorded_workload_kind(rt, no_requests):
    body = GMS().uid("u1").generation(3).obj()
    p, admitted = _decide(body, rt)
    status: dict = {}
    reconcile.calculate_status(status, body, p, admitted)
    status["workload"] = "LeaderWorkerSet"  # what the workload's own events said since
    newer = GMS().uid("u1").generation(4).obj()
    p4, admitted4 = _decide(newer, rt)
    assert reconcile.calculate_status(status, newer, p4, admitted4) is True
    assert status["observedGeneration"] == 4 and status["workload"] == "LeaderWorkerSet"


def test_kopfs_diff_base_is_held_in_memory_and_writes_nothing():
    """reconcile.HandledSpecs (issue 37 item 5): kopf's record of the last spec handled costs no PATCH; the
    annotation an earlier operator wrote is read until this one handles the server; a deleted server is forgotten."""
    import json

    import kopf

    key = f"{reconcile.ANNOTATION_PREFIX}/last-handled-configuration"
    old = {"spec": {"model": "old"}}
    raw = {
        "metadata": {"uid": "u1", "name": "s", "namespace": "ns", "annotations": {key: json.dumps(old)}},
        "spec": {"model": "new"},
    }
    body = kopf.Body(raw)
    handled = reconcile.HandledSpecs()
    assert handled.fetch(body=body) == old  # an earlier operator's record
    essence = handled.build(body=body)
    assert key not in (essence.get("metadata") or {}).get("annotations", {})  # never part of the essence
    patch = kopf.Patch()
    handled.store(body=body, patch=patch, essence=essence)
    assert not patch  # nothing to write
    assert handled.fetch(body=body) == essence == {"spec": {"model": "new"}}
    handled.forget("u1")
    assert handled.fetch(body=body) == old


@pytest.mark.parametrize(
    "extra_fields",
    [None, [("spec",)], [("status", "phase")], [("metadata", "finalizers")]],
    ids=["none", "spec", "status field", "metadata field"],
)
def test_the_diff_base_is_kopfs_own_essence_built_from_less(extra_fields):
    """HandledSpecs.build hands kopf the body without status and managedFields (kopf deep-copies what it is given,
    then drops them): the essence must be exactly the one kopf builds from the whole body, kopf's own annotations
    dropped, labels and annotations kept, and an extra field from status or metadata still picked."""
    import kopf

    key = f"{reconcile.ANNOTATION_PREFIX}/last-handled-configuration"
    raw = {
        "apiVersion": "serving.gdn-operator.io/v1alpha1",
        "kind": "GDNModelServer",
        "metadata": {
            "uid": "u1",
            "name": "s",
            "namespace": "ns",
            "resourceVersion": "7",
            "generation": 3,
            "labels": {"team": "a"},
            "annotations": {key: "{}", "note": "kept", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "finalizers": ["x"],
            "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "u0"}],
            "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {"f:model": {}}}}],
        },
        "spec": {"model": "new", "maxModelLen": 8192, "extraArgs": ["--a"]},
        "status": {"phase": "Ready", "conditions": [{"type": "Validated", "status": "True"}]},
    }
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=reconcile.ANNOTATION_PREFIX, key="last-handled-configuration")
    want = kopfs.build(body=kopf.Body(copy.deepcopy(raw)), extra_fields=extra_fields)
    got = reconcile.HandledSpecs().build(body=kopf.Body(copy.deepcopy(raw)), extra_fields=extra_fields)
    assert got == want
    assert got["metadata"] == {"labels": {"team": "a"}, "annotations": {"note": "kept"}} | (
        {"finalizers": ["x"]} if extra_fields == [("metadata", "finalizers")] else {}
    )
    assert ("status" in got) == (extra_fields == [("status", "phase")])


def test_a_kind_without_changing_handlers_gets_an_empty_essence():
    """Narrowed to servers (main.narrow_essences), HandledSpecs builds nothing for a Deployment's event (kopf
    hands a watching cause no essence); a server's essence is still kopf's own."""
    import kopf

    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}
    server = {"kind": "GDNModelServer", "metadata": {"name": "s"}, "spec": {"model": "m"}, "status": {"phase": "Ready"}}
    handled = reconcile.HandledSpecs()
    assert handled.build(body=kopf.Body(dep)) == {"spec": {"replicas": 1}}  # not narrowed: every kind, as kopf
    handled.essential_kinds = frozenset({"GDNModelServer"})
    assert handled.build(body=kopf.Body(dep)) == {}
    assert handled.build(body=kopf.Body(server)) == {"spec": {"model": "m"}}


def test_the_generation_is_the_planned_bodys_even_when_the_write_starts_from_a_newer_one(rt, no_requests):
    """The status write reruns calculate_status on the newest body it holds: a generation planned earlier must not
    be reported as the newer one (that one's own reconcile reports it)."""
    body = GMS().uid("u1").generation(3).obj()
    p, admitted = _decide(body, rt)
    status: dict = {}
    newer = GMS().uid("u1").generation(4).obj()
    reconcile.calculate_status(status, newer, p, admitted)
    assert status["observedGeneration"] == 3 and st.get_condition(status, st.VALIDATED)["observedGeneration"] == 3
