"""Hostile input through the real API server and the operator's webhook (issue 11, parts 1, 3, 4).

Each test is a regression test for a defect the issue reports: a bypass spelling admitted, an
undeployable spec admitted then retried as transient, a webhook answering HTTP 500.
"""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers.server.reconcile import refused_as_invalid
from operator_harness import gms, running_webhook_operator, wait_for

V32 = {"tag": "v0.32.0", "vllmVersion": "0.32.0"}


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-hostile")) as proc:
        # positive evidence the API server calls the webhook: a dry-run create of a valid object is admitted.
        # After this, an HTTP 500 in a test is the webhook failing, never a webhook not yet in use.
        wait_for(
            lambda: post_raw(kube_api, "default", json.dumps(gms("warmup")), dry_run=True)[0] == 201,
            60,
            interval=0.5,
            what="webhook answering",
        )
        yield proc


def post_raw(api: kubernetes.client.ApiClient, ns: str, text: str, dry_run: bool = False) -> tuple[int, dict]:
    """POST a GDNModelServer as raw JSON text (the Python client cannot serialise 1000-deep values)."""
    method, url, headers, body, _ = api.param_serialize(
        "POST",
        f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" + ("?dryRun=All" if dry_run else ""),
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
    )
    # the client json-encodes any body it is given: send the text through its connection pool as is
    resp = api.rest_client.pool_manager.request(method, url, body=text.encode(), headers=headers, timeout=60)
    return resp.status, json.loads(resp.data or b"{}")


def create_answer(api, ns, obj) -> tuple[int, dict]:
    return post_raw(api, ns, json.dumps(obj))


@pytest.mark.parametrize(
    "args, field",
    [
        (["--spec-method=mtp", "--spec-tokens=2"], "spec.speculativeDecoding.method"),
        (["--as"], "spec.asyncScheduling"),
        (["-cc.cudagraph_mode=NONE"], "spec.cudagraphMode"),
        (["--hf-token=hf_abcdefghijklmnopqrstu"], "spec.model.hfTokenSecret"),
    ],
)
def test_extra_args_bypass_spellings_denied_by_the_webhook(op, kube_api, ns, args, field):
    status, body = create_answer(kube_api, ns, gms("bypass", image=V32, extraArgs=args))
    assert status == 422, body.get("message")
    msg = body["message"]
    assert "spec.extraArgs" in msg and "which the operator owns" in msg and field in msg
    assert "hf_abcdefghij" not in msg


@pytest.mark.parametrize(
    "name, patch, text",
    [
        ("aff", {"affinity": {"x": 1}}, "spec.affinity: affinity.x: unknown field"),
        ("tol", {"tolerations": [{"key": "a", "tolerationSeconds": "10"}]}, "tolerations[0].tolerationSeconds"),
        ("cpu", {"resources": {"cpu": "16\n"}}, "spec.resources.cpu"),
        (
            "sem",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Bogus", "values": ["b"]}]}]
                        }
                    }
                }
            },
            "operator: 'Bogus' is not one of",
        ),
        ("tsec", {"tolerations": [{"key": "a", "tolerationSeconds": 10}]}, "must be NoExecute when tolerationSeconds"),
        ("ver", {"image": {"tag": "v0.28.0", "vllmVersion": "0.28.0\n"}}, "spec.image.vllmVersion"),
        ("1abc", {}, "DNS-1035"),
        ("a.b", {}, "DNS-1035"),
        ("a" * 64, {}, "DNS-1035"),
    ],
)
def test_undeployable_specs_denied_at_admission(op, kube_api, k, ns, name, patch, text):
    status, body = create_answer(kube_api, ns, gms(name, **patch))
    assert status == 422 and text in body["message"], body
    with pytest.raises(ApiException) as ei:
        k.get(ns, name)
    assert ei.value.status == 404


def test_oversized_object_is_a_4xx_naming_the_field(op, kube_api, ns):
    big = gms("big", env=[{"name": f"V{i}", "value": "x" * 30000} for i in range(40)])  # ~1.2 MiB: > aiohttp's 1 MiB
    status, body = create_answer(kube_api, ns, big)
    assert status == 422, body.get("message")
    assert "more than the 512 KiB limit" in body["message"] and "spec.env" in body["message"]


def test_deep_nesting_is_a_4xx_naming_the_field(op, kube_api, ns):
    deep = '{"x":[' * 1000 + "1" + "]}" * 1000
    obj = json.dumps(gms("deep")).replace('"startupBudgetSeconds": 300', '"startupBudgetSeconds": 300, "affinity": ' + deep)
    assert '"affinity"' in obj

    status, body = post_raw(kube_api, ns, obj)
    assert status == 422, body.get("message")
    assert "spec.affinity" in body["message"] and "nested deeper than" in body["message"]


def test_apply_refused_as_invalid_is_permanent_not_retried(op, k, kube_api, ns):
    """Admitted, then refused by the API server (here a ValidatingAdmissionPolicy: 422 Invalid): the
    status says why, Progressing is not left True, and the handler finishes (no retry loop)."""
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    policy = f"deny-{ns}"
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.metadata.name != 'semantic'",
                        "message": "engine Deployments named semantic are not allowed here",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        }
    )
    try:

        def refused_by_policy():  # the policy takes a moment to be enforced: probe with a dry-run Deployment
            probe = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "semantic", "namespace": ns},
                "spec": {
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
                },
            }
            try:
                k.apps.create_namespaced_deployment(ns, probe, dry_run="All")
            except ApiException as e:
                return e.status == 422
            return False

        wait_for(refused_by_policy, 30, what="admission policy enforced")
        k.create(ns, gms("semantic"))
        cond = k.wait_condition(ns, "semantic", "Validated", "False", timeout=60)
        assert cond["reason"] == "InvalidSpec" and "not allowed here" in cond["message"]
        prog = k.condition(ns, "semantic", "Progressing")
        assert prog is None or prog["status"] == "False"
        # positive evidence that the handler finished with "refused" (kopf retries only on an exception)
        wait_for(lambda: "reconciled: refused" in op.log_path.read_text(errors="replace"), 30, what="handler outcome logged")
        assert len([e for e in k.events(ns, "semantic", "ApplyRefused")]) == 1
    finally:
        adm.delete_validating_admission_policy_binding(policy)
        adm.delete_validating_admission_policy(policy)


def test_server_side_apply_500_for_undeclared_fields_is_classified_permanent(kube_api, ns):
    """The API server answers SSA of an undeclared field with HTTP 500; the operator must not retry it."""
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ssa", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"affinity": {"x": 1}, "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    with pytest.raises(ApiException) as ei:
        kubernetes.client.AppsV1Api(kube_api).patch_namespaced_deployment(
            "ssa", ns, dep, field_manager="t", force=True, _content_type="application/apply-patch+yaml"
        )
    assert ei.value.status in (400, 422, 500)
    assert refused_as_invalid(ei.value), ei.value.body
