"""The guard webhook's scope and answer without a cluster (handlers/guard/admission.py; the real API server
round trip is tests/integration/test_guard_admission.py)."""

import pytest

from gdn_operator.api.guard import GDNGuardSpec
import json

from gdn_operator.handlers.guard.admission import (
    BYPASS_LABEL,
    CONFIG_BUDGET_BYTES,
    GUARD_WEBHOOK_ID,
    GuardAdmission,
    LEFT_OUT_BUDGET,
    LEFT_OUT_NAMESPACE,
    guard_configuration,
    guard_scope,
    guard_webhooks,
    handler_client_config,
    review_response,
)
from gdn_operator.watch.guarded import selects

from builders import CLEAN_ARGS, SPECULATIVE_CONFIG as SC, Guard, Workload

#: the guard the reviews below are judged by: it selects app=g in namespace team, and refuses a known crash
DENY = Guard("g", "team").policy("deny")
G = {"app": "g"}
#: a bare pod it selects (a Pod is its own template) launching ENGINE_ARGS: at tag v0.17.1, vllm#36917's known crash
POD = Workload("p", "Pod").labels(G)


def test_one_webhook_per_guard_scoped_by_its_namespace_and_match_conditions():
    cc = {"url": "https://127.0.0.1:9443/", "caBundle": "Q0E="}
    hooks = guard_webhooks(
        [
            Guard("b", "team").policy("deny").obj(),
            Guard("a", "team").obj(),
            Guard("off", "team").features(admission=False).obj(),
            {"metadata": {"name": "bad", "namespace": "x"}, "spec": {"selector": {}}},
        ],
        "cfg.example.io",
        cc,
    )
    assert len(hooks) == 2  # admission off and an invalid guard are not in force
    by_policy = {h["failurePolicy"]: h for h in hooks}
    assert set(by_policy) == {"Ignore", "Fail"}  # warn: never holds a workload up; deny: never skipped
    for h in hooks:
        exprs = h["namespaceSelector"]["matchExpressions"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team"]} in exprs
        assert any(e["operator"] == "NotIn" and "kube-system" in e["values"] for e in exprs)
        assert {"key": BYPASS_LABEL, "operator": "DoesNotExist"} in exprs  # the break-glass
        assert h["objectSelector"] == {}  # selection is the matchCondition: object or template labels
        assert [c["name"] for c in h["matchConditions"]] == ["selected-by-the-guard", "not-made-by-a-judged-controller"]
        assert h["clientConfig"] == {"url": f"https://127.0.0.1:9443/{GUARD_WEBHOOK_ID}", "caBundle": "Q0E="}
        assert h["name"].endswith(f".{GUARD_WEBHOOK_ID}.cfg.example.io") and all(len(p) <= 63 for p in h["name"].split("."))
        assert {op for r in h["rules"] for op in r["operations"]} == {"CREATE", "UPDATE"}
        resources = {res for r in h["rules"] for res in r["resources"]}
        assert {"deployments", "statefulsets", "replicasets", "daemonsets", "jobs", "cronjobs", "pods"} <= resources
    assert "'app' in object.metadata.labels" in by_policy["Ignore"]["matchConditions"][0]["expression"]
    assert "object.spec.template.metadata.labels" in by_policy["Ignore"]["matchConditions"][0]["expression"]
    assert "oldObject != null" in by_policy["Ignore"]["matchConditions"][0]["expression"]
    assert guard_webhooks([Guard("a", "team").obj()], "c.x.io", cc) == guard_webhooks([Guard("a", "team").obj()], "c.x.io", cc)


def test_system_and_operator_namespaces_get_no_guard_webhook_and_the_configuration_stays_bounded():
    cc = {"url": "https://127.0.0.1:9443/"}
    scope = guard_scope(
        [
            Guard("k", "kube-system").policy("deny").obj(),
            Guard("o", "gdn-system").policy("deny").obj(),
            Guard("t", "team").policy("deny").obj(),
        ],
        "c.x.io",
        cc,
        excluded=("gdn-system",),
    )
    assert len(scope.webhooks) == 1
    assert scope.left_out == {"kube-system/k": LEFT_OUT_NAMESPACE, "gdn-system/o": LEFT_OUT_NAMESPACE}
    # the most a guard may hold (CRD bounds), many times: guards past the budget are left out, with a reason
    big = {
        "matchLabels": {f"k{i}": "v" * 63 for i in range(8)},
        "matchExpressions": [
            {"key": f"e{i}", "operator": "In", "values": [f"{j}" + "v" * 60 for j in range(16)]} for i in range(8)
        ],
    }
    guards = [Guard(f"g{i:03d}", f"ns{i:03d}").policy("deny").selector(big).obj() for i in range(400)]
    scope = guard_scope(guards, "c.x.io", cc)
    assert scope.webhooks and scope.left_out and set(scope.left_out.values()) == {LEFT_OUT_BUDGET}
    assert len(json.dumps(guard_configuration(scope.webhooks, "c.x.io"))) <= CONFIG_BUDGET_BYTES + 4096
    assert len(scope.webhooks) + len(scope.left_out) == 400


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
    """A guard's spec.selector, as the API model dumps it, read by the one selector matcher (watch/guarded.py)."""
    assert selects(GDNGuardSpec.model_validate({"selector": selector}).selector.dump(), labels) is selected


def review(obj, old=None, ns="team"):
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "namespace": ns, "object": obj, "oldObject": old},
    }


def test_bare_pod_refused_controlled_pod_and_unchanged_update_admitted():
    guards = [DENY.obj()]
    r = review_response(review(POD.tag("v0.17.1").obj()), guards)["response"]
    assert r["uid"] == "u1" and r["allowed"] is False and r["status"]["code"] == 403 and "vllm#36917" in r["status"]["message"]
    owned = POD.owner("ReplicaSet", "rs", api_version="apps/v1").tag("v0.17.1").obj()
    assert review_response(review(owned), guards)["response"] == {"uid": "u1", "allowed": True}
    relabelled = POD.labels({**G, "x": "y"}).tag("v0.17.1").obj()
    assert review_response(review(relabelled, old=POD.tag("v0.17.1").obj()), guards)["response"]["allowed"] is True


def test_warn_guard_answers_with_warnings_and_unselected_objects_pass():
    r = review_response(review(POD.tag("v0.17.1").obj()), [Guard("g", "team").obj()])["response"]
    assert r["allowed"] is True and any(w.startswith("GDNGuard team/g: vllm#36917:") for w in r["warnings"])
    r = review_response(review(POD.labels({"app": "other"}).tag("v0.17.1").obj()), [DENY.obj()])["response"]
    assert r == {"uid": "u1", "allowed": True}


def test_deny_holds_where_users_put_the_label_and_when_an_update_drops_it():
    """Issue 48: the label on the pod template only (where users put it for their pods) is guarded; an UPDATE that
    changes the launch line and drops the label in one step is judged as the guarded object it was; a ReplicaSet a
    Deployment made is judged through the Deployment, and an object a controller of another kind made is judged."""
    guards = [DENY.obj()]
    r = review_response(review(Workload("d").template_labels(G).tag("v0.17.1").obj()), guards)["response"]
    assert r["allowed"] is False and "vllm#36917" in r["status"]["message"]
    old = Workload("d").labels(G).template_labels(G).tag("v0.33.0").obj()
    new = Workload("d").tag("v0.17.1").obj()
    r = review_response(review(new, old=old), guards)["response"]
    assert r["allowed"] is False and "vllm#36917" in r["status"]["message"]
    dropped_only = Workload("d").tag("v0.33.0").obj()
    assert review_response(review(dropped_only, old=old), guards)["response"]["allowed"] is True  # unguard in a step
    rs = Workload("d", "ReplicaSet").labels(G).owner("Deployment").tag("v0.17.1").obj()
    assert review_response(review(rs), guards)["response"] == {"uid": "u1", "allowed": True}
    foreign = Workload("d").labels(G).owner("MyInferenceThing").tag("v0.17.1").obj()
    assert review_response(review(foreign), guards)["response"]["allowed"] is False


def test_a_shell_script_with_an_apostrophe_is_judged_not_a_500():
    """Issue 48: `bash -c "echo it's up; exec vllm serve ..."` made shlex raise, the webhook answered HTTP 500, and
    a deny guard refused a valid workload. The vLLM command is read from the script and judged."""
    guards = [DENY.obj()]
    script = f"echo it's up; exec vllm serve Qwen/Qwen3.5-9B --speculative-config '{SC}'"
    p = POD.tag("v0.17.1").engine(command=["/bin/bash", "-c", script], args=None).obj()
    r = review_response(review(p), guards)["response"]
    assert r["allowed"] is False and "vllm#36917" in r["status"]["message"]  # judged: the known crash refused
    clean = POD.tag("v0.33.0").engine(command=["/bin/bash", "-c", " ".join([script, *CLEAN_ARGS])], args=None).obj()
    assert review_response(review(clean), guards)["response"]["allowed"] is True


async def test_the_scope_task_survives_an_error_that_is_not_an_os_error(monkeypatch):
    """Issue 48: the guard-scope task ended for good on the first urllib3 error that is not an OSError (a dropped
    connection mid-answer: ProtocolError), and guard webhooks were never written again."""
    import asyncio
    from http.client import RemoteDisconnected

    import urllib3

    from gdn_operator.handlers.guard import admission as guardadmission
    from gdn_operator.handlers.guard import client as guardclient

    calls, written = [], []

    def list_guards(namespaces):
        calls.append(namespaces)
        if len(calls) == 1:
            raise urllib3.exceptions.ProtocolError("Connection aborted.", RemoteDisconnected("closed"))
        return [DENY.obj()]

    monkeypatch.setattr(guardclient, "list_guards", list_guards)
    monkeypatch.setattr(guardadmission, "write_configuration", lambda desired: written.append(desired) or True)
    monkeypatch.setattr(guardadmission, "RETRY_SECONDS", 0.01)
    ga = guardadmission.GuardAdmission("c.x.io")
    ga.published({"url": "https://127.0.0.1:9443/"})
    task = asyncio.create_task(ga.run())
    try:
        for _ in range(500):
            if written:
                break
            await asyncio.sleep(0.01)
        assert written and len(written[0]["webhooks"]) == 1, (calls, task)
    finally:
        task.cancel()


async def test_reviews_read_the_guards_held_in_memory(monkeypatch):
    """No API read per review: the guards come from their events (a LIST only before the first)."""
    from gdn_operator.handlers.guard import admission as guardadmission
    from gdn_operator.handlers.guard import client as guardclient

    lists = []
    monkeypatch.setattr(guardclient, "list_guards", lambda ns: lists.append(ns) or [DENY.obj()])
    ga = guardadmission.GuardAdmission("c.x.io")
    for _ in range(5):
        r = (await ga.answer(review(POD.tag("v0.17.1").obj())))["response"]
        assert r["allowed"] is False
    assert len(lists) == 1
    ga.guard_changed("DELETED", DENY.obj())
    assert (await ga.answer(review(POD.tag("v0.17.1").obj())))["response"]["allowed"] is True
    assert len(lists) == 1


async def test_a_guard_deleted_while_a_list_runs_stays_deleted(monkeypatch):
    """The LIST that refreshes the guards held for reviews may return a guard whose DELETED event came while it
    ran: the event wins (a deleted deny guard must not refuse for another minute)."""
    from gdn_operator.handlers.guard import admission as guardadmission
    from gdn_operator.handlers.guard import client as guardclient

    ga = guardadmission.GuardAdmission("c.x.io")

    def slow_list(ns):
        ga.guard_changed("DELETED", DENY.obj())  # arrives while the LIST runs
        return [DENY.obj()]

    monkeypatch.setattr(guardclient, "list_guards", slow_list)
    await ga._list()
    assert ga.guards_in("team") == []
    assert (await ga.answer(review(POD.tag("v0.17.1").obj())))["response"]["allowed"] is True


def test_a_guard_in_an_excluded_namespace_says_so_before_the_first_configuration_is_written():
    """The Admission condition of a guard in kube-system (or a namespace the operator excludes, its own) is False /
    NamespaceExcluded from the first status write on: the namespace alone decides it, so it does not wait for the
    configuration loop (a loaded run wrote True/Scoped first, tests/integration/test_guard_hostile.py)."""
    ga = GuardAdmission("c.x.io", excluded=["gdn-system"])
    assert ga.left_out == {}  # the configuration loop has not run
    for namespace in ("kube-system", "gdn-system"):
        in_force, reason, message = ga.coverage(namespace, "g")
        assert (in_force, reason) == (False, "NamespaceExcluded") and namespace in message
    assert ga.coverage("team-a", "g")[:2] == (True, "Scoped")
