"""The guard webhook's scope and answer without a cluster (handlers/guardadmission.py; the real API server
round trip is tests/integration/test_guard_admission.py)."""

import pytest

from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.handlers.guardadmission import GUARD_WEBHOOK_ID, guard_webhooks, handler_client_config, review_response, selects

SC = '{"method":"mtp","num_speculative_tokens":2}'


def guard(name, ns, policy="warn", admission=True, **selector):
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": selector or {"matchLabels": {"app": name}},
            "admission": {"policy": policy},
            "features": {"admission": admission},
        },
    }


def test_one_webhook_per_guard_scoped_by_its_selector_and_namespace():
    cc = {"url": "https://127.0.0.1:9443/", "caBundle": "Q0E="}
    hooks = guard_webhooks(
        [
            guard("b", "team", "deny"),
            guard("a", "team"),
            guard("off", "team", admission=False),
            {"metadata": {"name": "bad", "namespace": "x"}, "spec": {"selector": {}}},
        ],
        "cfg.example.io",
        cc,
    )
    assert len(hooks) == 2  # admission off and an invalid guard are not in force
    by_policy = {h["failurePolicy"]: h for h in hooks}
    assert by_policy["Ignore"]["objectSelector"] == {"matchLabels": {"app": "a"}}  # warn: never holds a workload up
    assert by_policy["Fail"]["objectSelector"] == {"matchLabels": {"app": "b"}}  # deny: never skipped
    for h in hooks:
        assert h["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "team"}}
        assert h["clientConfig"] == {"url": f"https://127.0.0.1:9443/{GUARD_WEBHOOK_ID}", "caBundle": "Q0E="}
        assert h["name"].endswith(f".{GUARD_WEBHOOK_ID}.cfg.example.io") and all(len(p) <= 63 for p in h["name"].split("."))
        assert {op for r in h["rules"] for op in r["operations"]} == {"CREATE", "UPDATE"}
    assert guard_webhooks([guard("a", "team")], "c.x.io", cc) == guard_webhooks([guard("a", "team")], "c.x.io", cc)


def test_service_client_config_gets_the_guard_path():
    cc = {"service": {"name": "gdn", "namespace": "gdn-system", "port": 443, "path": ""}, "caBundle": "x"}
    assert handler_client_config(cc)["service"]["path"] == f"/{GUARD_WEBHOOK_ID}"
    assert cc["service"]["path"] == ""  # not modified in place


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, {"tier": "gpu"}, True),
        (
            {"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]},
            {"app": "a", "tier": "gpu"},
            False,
        ),
        (
            {"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]},
            {"app": "a"},
            True,
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
        (
            {"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            {"app": "a", "tier": ""},
            False,
        ),
    ],
)
def test_selector_semantics(selector, labels, selected):
    assert selects(GDNGuardSpec.model_validate({"selector": selector}), labels) is selected


def review(obj, old=None, ns="team"):
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "namespace": ns, "object": obj, "oldObject": old},
    }


def pod(tag, owned=False, labels=None):
    meta = {"name": "p", "labels": labels or {"app": "g"}}
    if owned:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "controller": True, "uid": "1", "apiVersion": "apps/v1"}]
    containers = [{"name": "vllm", "image": f"vllm/vllm-openai:{tag}", "args": ["Qwen/Qwen3.5-9B", "--speculative-config", SC]}]
    return {"kind": "Pod", "metadata": meta, "spec": {"containers": containers}}


def test_bare_pod_refused_controlled_pod_and_unchanged_update_admitted():
    guards = [guard("g", "team", "deny")]
    r = review_response(review(pod("v0.17.1")), guards)["response"]
    assert r["uid"] == "u1" and r["allowed"] is False and r["status"]["code"] == 403 and "vllm#36917" in r["status"]["message"]
    assert review_response(review(pod("v0.17.1", owned=True)), guards)["response"] == {"uid": "u1", "allowed": True}
    relabelled = pod("v0.17.1")
    relabelled["metadata"]["labels"]["x"] = "y"
    assert review_response(review(relabelled, old=pod("v0.17.1")), guards)["response"]["allowed"] is True


def test_warn_guard_answers_with_warnings_and_unselected_objects_pass():
    r = review_response(review(pod("v0.17.1")), [guard("g", "team", "warn")])["response"]
    assert r["allowed"] is True and any(w.startswith("GDNGuard team/g: vllm#36917:") for w in r["warnings"])
    r = review_response(review(pod("v0.17.1", labels={"app": "other"})), [guard("g", "team", "deny")])["response"]
    assert r == {"uid": "u1", "allowed": True}
