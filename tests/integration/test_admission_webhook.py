"""Admission webhooks through the real API server: AdmissionReview round trips, denial text seen by the
client, mitigation applied by the mutating webhook. The operator serves HTTPS with its own CA and kopf
manages the webhook configurations (caBundle included)."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from operator_harness import WEBHOOK_CONFIG, gms, running_webhook_operator, wait_for


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-webhook")) as proc:
        yield proc


def create_until_webhook_answers(k, ns, obj):
    """The API server may need a moment to pick up a fresh webhook configuration."""

    def attempt():
        try:
            return ("created", k.create(ns, obj))
        except ApiException as e:
            if e.status == 500 and "failed calling webhook" in (e.body or ""):
                return None
            return ("denied", e)

    return wait_for(attempt, 30, interval=0.5, what="webhook answer")


def test_webhook_configuration_has_ca_bundle(op, kube_api):
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    v = adm.read_validating_webhook_configuration(WEBHOOK_CONFIG)
    assert len(v.webhooks) == 1, "exactly one validating webhook serves all rules"
    hook = v.webhooks[0]
    assert hook.client_config.ca_bundle
    assert hook.client_config.url.startswith("https://127.0.0.1:")
    assert hook.failure_policy == "Fail"


def test_known_crash_denied_with_upstream_issue_fields_and_fix(op, k, ns):
    obj = gms(
        "denied", image={"tag": "v0.28.0", "vllmVersion": "0.28.0"}, admissionPolicy="reject", prefixCaching=True
    )  # set by the user: judged by the policy (unset, it resolves to false)
    outcome, err = create_until_webhook_answers(k, ns, obj)
    assert outcome == "denied"
    assert err.status == 403
    message = json.loads(err.body)["message"]
    assert "vllm#43559" in message
    assert "spec.prefixCaching" in message
    assert "prefixCaching: false" in message or "prefixCaching=false" in message or "--no-enable-prefix-caching" in message
    with pytest.raises(ApiException) as ei:
        k.get(ns, "denied")
    assert ei.value.status == 404  # nothing half-applied


def test_invalid_spec_denied_with_field_path(op, k, ns):
    obj = gms("badflag", extraArgs=["--speculative-config={}"])
    outcome, err = create_until_webhook_answers(k, ns, obj)
    assert outcome == "denied" and err.status == 422
    assert "spec.extraArgs" in json.loads(err.body)["message"]


def test_mitigate_policy_leaves_the_spec_and_renders_an_override(op, k, ns):
    obj = gms("mitig", image={"tag": "v0.28.0", "vllmVersion": "0.28.0"}, admissionPolicy="mitigate", prefixCaching=True)
    outcome, created = create_until_webhook_answers(k, ns, obj)
    assert outcome == "created"
    # spec mutation is opt-in (GDN_MUTATE_SPEC): the spec stays as submitted, the change is an override
    assert created["spec"]["prefixCaching"] is True
    assert "serving.gdn-operator.io/mitigations" not in (created["metadata"].get("annotations") or {})
    dep = wait_for(lambda: k.deployment(ns, "mitig"), 30, what="Deployment")
    assert "--no-enable-prefix-caching" in dep.spec.template.spec.containers[0].args
    ov = wait_for(lambda: k.status(ns, "mitig").get("overrides"), 30, what="status.overrides")
    assert [(o["path"], o["value"], o["reason"]) for o in ov] == [("prefixCaching", False, "vllm#43559")]
    assert k.get(ns, "mitig")["spec"]["prefixCaching"] is True


def test_admitted_config_passes_and_updates_are_checked(op, k, ns):
    outcome, created = create_until_webhook_answers(k, ns, gms("fine"))
    assert outcome == "created"
    # Turning prefix caching on with MTP later is refused as well (UPDATE goes through the webhook).
    with pytest.raises(ApiException) as ei:
        k.patch(ns, "fine", {"spec": {"prefixCaching": True, "admissionPolicy": "reject"}})
    assert ei.value.status == 403 and "vllm#43559" in json.loads(ei.value.body)["message"]
    # Metadata-only updates of an object are never blocked.
    k.patch(ns, "fine", {"metadata": {"labels": {"team": "llm"}}})
    assert k.get(ns, "fine")["metadata"]["labels"]["team"] == "llm"


def test_denials_are_counted_in_operator_metrics(op, k, ns):
    obj = gms("counted", image={"tag": "v0.17.1", "vllmVersion": "0.17.1"}, admissionPolicy="reject")
    outcome, err = create_until_webhook_answers(k, ns, obj)
    assert outcome == "denied" and "vllm#36917" in json.loads(err.body)["message"]
    # answered by the webhook front (front.py), which reports its counts to the operator's process
    # every REPORT_SECONDS: the operator's /metrics has them shortly after the answer, not with it
    sample = 'gdn_admission_decisions_total{decision="denied",namespace="%s",rule="vllm#36917"} ' % ns
    line = wait_for(lambda: next((ln for ln in op.metrics().splitlines() if ln.startswith(sample)), None), 10, what=sample)
    assert line == sample + "1.0"
