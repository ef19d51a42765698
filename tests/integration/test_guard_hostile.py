"""GDNGuard under hostile input, through the real API server (issue 48). Each test is the regression test of a
finding: a user's regular expression spending the operator's CPU past the webhook's timeout, a selector of only
negations, a deny guard that a label on the pod template (or an UPDATE that drops the label) slips past, pods of a
running workload that cannot be replaced while the operator is down, and guards in the cluster's own namespaces."""

from __future__ import annotations

import json
import time

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, GUARD_PLURAL, VERSION
from gdn_operator.api.crd import guard_crd_manifest
from gdn_operator.handlers.guard.admission import guard_config_name
from builders import CLEAN_ARGS, Guard, Workload
from operator_harness import WEBHOOK_CONFIG, install_crd, running_webhook_operator, wait_for

GUARDS_CONFIG = guard_config_name(WEBHOOK_CONFIG)
ENV = {"GDN_GUARD_INTERVAL": "1"}
#: the guards here deny (for a namespaced create: no namespace in their bodies)
DENY = Guard(namespace=None).policy("deny")
#: admission judges the template: no pods needed
NO_PODS = Workload().replicas(0)


def _cleanup(kube_api):
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    try:
        adm.delete_validating_webhook_configuration(GUARDS_CONFIG)
    except ApiException as e:
        if e.status != 404:
            raise


def _install(kube_api):
    install_crd(kube_api)
    install_crd(kube_api, guard_crd_manifest())
    co = kubernetes.client.CustomObjectsApi(kube_api)
    wait_for(lambda: co.list_cluster_custom_object(GROUP, VERSION, GUARD_PLURAL) is not None, 30, what="GDNGuard CRD served")


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    _install(kube_api)
    try:
        with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-guard-hostile"), env=ENV) as p:
            yield p
    finally:
        _cleanup(kube_api)


def webhook_of(kube_api, ns):
    adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    try:
        cfg = adm.read_validating_webhook_configuration(GUARDS_CONFIG)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    for h in cfg.webhooks or []:
        sel = h.namespace_selector
        exprs = (sel.match_expressions or []) if sel else []
        if (
            any(e.operator == "In" and e.values == [ns] for e in exprs)
            or ((sel and sel.match_labels) or {}).get("kubernetes.io/metadata.name") == ns
        ):  # (matchLabels: how the configuration was written before issue 48)
            return h
    return None


def create_guard(kube_api, ns, body):
    kubernetes.client.CustomObjectsApi(kube_api).create_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, body)
    wait_for(lambda: webhook_of(kube_api, ns), 60, what=f"guard webhook for {ns}")


def create(kube_api, ns, obj):
    """(status, body, seconds): the create's answer through the guard webhook (a fresh webhook may need a moment
    before the API server calls it: retried while it says it failed calling it)."""
    apps = kubernetes.client.AppsV1Api(kube_api)

    def attempt():
        t0 = time.monotonic()
        try:
            apps.create_namespaced_deployment(ns, obj)
            return 201, {}, time.monotonic() - t0
        except ApiException as e:
            if e.status == 500 and "failed calling webhook" in (e.body or ""):
                return None
            return e.status, json.loads(e.body or "{}"), time.monotonic() - t0

    return wait_for(attempt, 30, interval=0.5, what="guard webhook answer")


def test_the_api_server_refuses_patterns_re2_refuses_and_selectors_of_only_negations(op, kube_api, ns):
    co = kubernetes.client.CustomObjectsApi(kube_api)
    bad = [
        ({"selector": {"matchLabels": {"app": "x"}}, "vllmVersion": {"imageTag": {"pattern": r"^(v)?\1([0-9.]+)"}}}, "RE2"),
        ({"selector": {"matchLabels": {"app": "x"}}, "vllmVersion": {"imageTag": {"pattern": r"(?=v)([0-9.]+)"}}}, "RE2"),
        (
            {"selector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}},
            "selects by nothing",
        ),
        ({"selector": {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}}, "selects by nothing"),
    ]
    for i, (spec, says) in enumerate(bad):
        with pytest.raises(ApiException) as e:
            co.create_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, DENY.name(f"bad-{i}").update(**spec).obj())
        assert e.value.status == 422 and says in json.loads(e.value.body)["message"], e.value.body


def test_a_catastrophic_pattern_is_judged_at_once(op, kube_api, ns):
    """`^(?:a+)+(b)` against a 30-character tag took the webhook's 10 s timeout (warn: admitted unjudged, the
    operator's CPU spent). Matched by RE2 it is judged at once: the operator logs its answer."""
    redos = Guard("redos", None).select({"app": "redos"}).policy("warn")
    create_guard(kube_api, ns, redos.update(vllmVersion={"imageTag": {"pattern": "^(?:a+)+(b)"}}).obj())
    status, _, seconds = create(kube_api, ns, NO_PODS.name("redos").labelled({"app": "redos"}).tag("a" * 30).obj())
    assert status == 201
    assert seconds < 3, seconds
    wait_for(lambda: f"guard admission admitted Deployment {ns}/redos" in op.log_tail(400), 10, what="the answer logged")


def test_deny_holds_where_users_put_the_label_and_through_an_update_that_drops_it(op, kube_api, ns):
    create_guard(kube_api, ns, DENY.name("tpl").select({"app": "tpl"}).obj())
    # the label on the pod template only (the Deployment's own labels differ): refused
    tpl_only = NO_PODS.name("tpl-only").labels({"team": "x"}).template_labels({"app": "tpl"}).selector({"app": "tpl"})
    status, body, _ = create(kube_api, ns, tpl_only.tag("v0.17.1").obj())
    assert status == 403 and "vllm#36917" in body.get("message", ""), body
    # a guarded clean Deployment, then one UPDATE that drops the label and switches to a known-crash release: refused
    pinned = NO_PODS.name("tpl-clean").selector({"pin": "c"})
    clean = pinned.labels({"app": "tpl"}).template_labels({"app": "tpl", "pin": "c"}).tag("v0.33.0").args(*CLEAN_ARGS).obj()
    status, _, _ = create(kube_api, ns, clean)
    assert status == 201
    dropped = pinned.labels({}).template_labels({"pin": "c"}).tag("v0.17.1").obj()
    apps = kubernetes.client.AppsV1Api(kube_api)
    with pytest.raises(ApiException) as e:
        apps.patch_namespaced_deployment("tpl-clean", ns, [
            {"op": "replace", "path": "/metadata/labels", "value": dropped["metadata"]["labels"]},
            {"op": "replace", "path": "/spec/template", "value": dropped["spec"]["template"]},
        ])  # fmt: skip
    assert e.value.status == 403 and "vllm#36917" in json.loads(e.value.body)["message"], e.value.body
    # dropping the label alone (no change to the pod template) is how a workload leaves the guard: admitted
    apps.patch_namespaced_deployment("tpl-clean", ns, [{"op": "replace", "path": "/metadata/labels", "value": {}}])


def test_guards_in_the_clusters_own_namespaces_get_no_webhook_and_say_so(op, kube_api, ns):
    co = kubernetes.client.CustomObjectsApi(kube_api)
    co.create_namespaced_custom_object(GROUP, VERSION, "kube-system", GUARD_PLURAL, DENY.name("sys").select({"app": "sys"}).obj())
    create_guard(kube_api, ns, DENY.name("beside").select({"app": "beside"}).obj())
    try:

        def admission_condition(namespace, name):
            st = co.get_namespaced_custom_object(GROUP, VERSION, namespace, GUARD_PLURAL, name).get("status") or {}
            return next((c for c in st.get("conditions") or [] if c["type"] == "Admission"), None)

        c = wait_for(lambda: admission_condition("kube-system", "sys"), 60, what="condition Admission on the kube-system guard")
        assert (c["status"], c["reason"]) == ("False", "NamespaceExcluded"), c
        assert webhook_of(kube_api, "kube-system") is None
        c = wait_for(lambda: admission_condition(ns, "beside"), 60, what="condition Admission")
        assert (c["status"], c["reason"]) == ("True", "Scoped") and "pod template labels" in c["message"], c
    finally:
        co.delete_namespaced_custom_object(GROUP, VERSION, "kube-system", GUARD_PLURAL, "sys")
