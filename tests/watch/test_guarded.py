"""What the guard controller reads of the pods it selects (watch/guarded.py, issue 35): selector, the release
problem (the engine container and release: rules/workload.py, tests/rules/test_guard_workload.py); and the guard status composition (handlers/guard/status.py): one condition per finding type, times kept while
nothing changes, so an unchanged round writes nothing."""

from __future__ import annotations

import json

import pytest

from gdn_operator.handlers.guard.status import Finding, WorkloadView, compose, fingerprint, policy_report
from gdn_operator.watch.guarded import selector_query, selects, version_problem


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}, {"app": "b"}, True),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {"app": "a"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"app": "a"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"app": "a"}, True),
        ({}, {"app": "a"}, False),  # an empty selector selects nothing here
        (None, {"app": "a"}, False),
    ],
)
def test_selector(selector, labels, want):
    assert selects(selector, labels) is want


@pytest.mark.parametrize(
    ("selector", "query"),
    [
        ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
        (
            {
                "matchLabels": {"app": "a"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
                    {"key": "zone", "operator": "NotIn", "values": ["x"]},
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "canary", "operator": "DoesNotExist"},
                ],
            },
            "app=a,tier in (gpu,cpu),zone notin (x),gpu,!canary",
        ),
    ],
)
def test_selector_query_is_the_list_calls_label_selector(selector, query):
    """The LIST of a guard's pods selects by the same selector, in the API server's string form."""
    assert selector_query(selector) == query


def test_version_problem_names_the_fix():
    assert "set spec.vllmVersion.pinned" in version_problem("imageTag", "corp/vllm:latest", None)
    assert "annotation team/vllm is not set" in version_problem("annotation", "corp/vllm:latest", "team/vllm")


def _view(*findings: Finding) -> WorkloadView:
    return WorkloadView("Deployment", "d", "0.33.0", "imageTag", 2, list(findings))


def test_status_conditions_per_finding_type_and_unchanged_round_unchanged():
    crash = Finding("CrashDiagnosed", "engine died", "2026-01-01T00:00:00Z", "vllm#36917", "d-1", 1)
    s1 = compose({}, [_view(crash)], 3, [])
    assert s1["observedGeneration"] == 3 and "phase" not in s1
    conds = {c["type"]: c for c in s1["conditions"]}
    assert conds["Ready"]["status"] == "True" and "1 workload(s), 2 engine pod(s)" in conds["Ready"]["message"]
    assert conds["CrashDiagnosed"]["status"] == "True" and "d-1: engine died" in conds["CrashDiagnosed"]["message"]
    (w,) = s1["workloads"]
    assert w["findings"] == [crash.to_status()] and w["conditions"][0]["type"] == "CrashDiagnosed"
    # the same findings again: the same status (times kept), so the round writes nothing
    s2 = compose(json.loads(json.dumps(s1)), [_view(crash)], 3, [])
    assert fingerprint(s2) == fingerprint(s1)
    # the finding gone: its condition turns False (kept, with a new transition time)
    s3 = compose(s2, [_view()], 3, [])
    conds = {c["type"]: c for c in s3["conditions"]}
    assert conds["CrashDiagnosed"]["status"] == "False" and conds["CrashDiagnosed"]["reason"] == "NoFinding"
    assert fingerprint(s3) != fingerprint(s2)


def test_invalid_guard_is_not_ready():
    s = compose({}, [], 1, ["spec.selector is empty: it selects no pod; set matchLabels"])
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "GuardInvalid" and "spec.selector" in ready["message"]


def test_policy_report_one_result_per_finding():
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns", "uid": "u1"}}
    f = Finding("Stalled", "8 running, no progress for 30s", "t", "engine-stall", "d-1")
    r = policy_report("ns", [("g", target, f)], 1700000000.5)
    assert r["apiVersion"] == "wgpolicyk8s.io/v1alpha2" and r["summary"]["fail"] == 1
    (res,) = r["results"]
    assert (res["policy"], res["rule"], res["result"], res["severity"]) == ("gdn-guard/g", "engine-stall", "fail", "high")
    assert res["resources"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "namespace": "ns", "uid": "u1"}]
    assert res["timestamp"] == {"seconds": 1700000000, "nanos": 0}
