"""The reconciler against the real control plane (etcd, apiserver, kcm, scheduler, kwok GPU nodes).

No admission webhook runs here: the reconciler must re-check every change by itself.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from operator_harness import gms, running_operator, wait_for


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-reconcile")) as proc:
        yield proc


def args_of(dep):
    return dep.spec.template.spec.containers[0].args


def flag(args, name):
    return args[args.index(name) + 1]


def test_create_renders_engine_and_goes_ready(op, k, ns, full_cluster):
    k.create(ns, gms("qwen", tensorParallelSize=2, maxModelLen=32768))
    dep = wait_for(lambda: k.deployment(ns, "qwen"), 30, what="Deployment")
    args = args_of(dep)
    assert flag(args, "--tensor-parallel-size") == "2"
    assert json.loads(flag(args, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    assert flag(args, "--max-model-len") == "32768"
    assert "--no-enable-prefix-caching" in args
    c = dep.spec.template.spec.containers[0]
    assert c.resources.limits["nvidia.com/gpu"] == "2"
    assert c.termination_message_policy == "FallbackToLogsOnError"
    owner = dep.metadata.owner_references[0]
    assert owner.kind == "GDNModelServer" and owner.name == "qwen" and owner.controller
    svc = wait_for(lambda: k.core.read_namespaced_service("qwen", ns), 30, what="Service")
    assert {p.name for p in svc.spec.ports} == {"http", "metrics"}

    k.wait_condition(ns, "qwen", "Ready", timeout=90)
    pods = k.engine_pods(ns, "qwen")
    assert len(pods) == 1
    assert pods[0].spec.node_name in full_cluster.node_names
    assert pods[0].status.phase == "Running"
    st = k.status(ns, "qwen")
    assert st["phase"] == "Ready"
    assert st["ready"] == "1/1"
    assert st["observedGeneration"] == 1  # written before the workload, so Ready never comes without it
    assert st["effective"]["vllmVersion"] == "0.33.0"
    validated = k.condition(ns, "qwen", "Validated")
    assert validated["status"] == "True"
    # no finalizers: deleting a server never waits for the operator to be up
    assert not k.get(ns, "qwen")["metadata"].get("finalizers")
    assert not any(p.metadata.finalizers for p in k.engine_pods(ns, "qwen"))
    assert any(e.reason == "Applied" for e in k.events(ns, "qwen"))


def test_tp16_on_8_gpu_nodes_is_unschedulable_and_isolated(op, k, ns):
    k.create(ns, gms("ok"))
    k.create(ns, gms("huge", tensorParallelSize=16))
    cond = k.wait_condition(ns, "huge", "Unschedulable", timeout=90)
    assert cond["reason"] == "InsufficientGPUs"
    assert "16 nvidia.com/gpu" in cond["message"]
    assert k.status(ns, "huge")["phase"] == "Unschedulable"
    assert k.deployment(ns, "huge").spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "16"
    k.wait_condition(ns, "ok", "Ready", timeout=90)
    assert k.status(ns, "ok")["phase"] == "Ready"


def test_update_tp_rolls_the_engine(op, k, ns):
    k.create(ns, gms("roll"))
    k.wait_condition(ns, "roll", "Ready", timeout=90)
    old = {p.metadata.name for p in k.engine_pods(ns, "roll")}
    k.patch(ns, "roll", {"spec": {"tensorParallelSize": 2}})
    wait_for(lambda: flag(args_of(k.deployment(ns, "roll")), "--tensor-parallel-size") == "2", 30, what="new argv")

    def rolled():
        pods = [p for p in k.engine_pods(ns, "roll") if not p.metadata.deletion_timestamp]
        return (
            len(pods) == 1
            and pods[0].metadata.name not in old
            and pods[0].spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
            and pods[0].status.phase == "Running"
        )

    wait_for(rolled, 120, what="rollout to TP=2")

    def done():
        s = k.status(ns, "roll")
        return s.get("observedGeneration") == 2 and s.get("phase") == "Ready"

    wait_for(done, 60, what="status of generation 2 Ready")


def test_delete_garbage_collects_everything(op, k, ns):
    k.create(ns, gms("gone"))
    wait_for(lambda: k.deployment(ns, "gone"), 30, what="Deployment")
    k.delete(ns, "gone")

    def collected():
        try:
            k.deployment(ns, "gone")
            return False
        except ApiException as e:
            if e.status != 404:
                raise
        try:
            k.core.read_namespaced_service("gone", ns)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for(collected, 60, what="Deployment and Service garbage-collected")
    wait_for(lambda: not k.engine_pods(ns, "gone"), 60, what="engine pods gone")


def test_drift_is_corrected(op, k, ns):
    k.create(ns, gms("drift"))
    wait_for(lambda: k.deployment(ns, "drift"), 30, what="Deployment")
    dep = k.deployment(ns, "drift")
    edited = list(args_of(dep)) + ["--enforce-eager"]
    k.apps.patch_namespaced_deployment(
        "drift", ns, {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": edited}]}}}}
    )
    wait_for(lambda: "--enforce-eager" not in args_of(k.deployment(ns, "drift")), 30, what="edit reverted")
    k.apps.delete_namespaced_deployment("drift", ns)
    wait_for(lambda: k.deployment(ns, "drift").metadata.deletion_timestamp is None, 30, what="Deployment recreated")
    assert k.events(ns, "drift", "DriftCorrected")


def test_operator_killed_mid_reconcile_resumes_without_duplicates(op, k, ns):
    k.create(ns, gms("crashy"))
    op.kill()  # right after the create: the handler may be half way through
    op.start()
    k.wait_condition(ns, "crashy", "Ready", timeout=90)
    # the interrupted handler is re-run after the restart: it completes what it had not applied yet
    wait_for(
        lambda: k.core.list_namespaced_service(ns, label_selector="serving.gdn-operator.io/server=crashy").items,
        90,
        what="Service applied by the resumed handler",
    )
    deps = k.apps.list_namespaced_deployment(ns, label_selector="serving.gdn-operator.io/server=crashy").items
    svcs = k.core.list_namespaced_service(ns, label_selector="serving.gdn-operator.io/server=crashy").items
    assert len(deps) == 1 and len(svcs) == 1
    assert len(k.engine_pods(ns, "crashy")) == 1
    rs = k.apps.list_namespaced_replica_set(ns, label_selector="serving.gdn-operator.io/server=crashy").items
    assert len(rs) == 1, "a restart must not change the pod template (no spurious rollout)"


def test_operator_owned_flag_left_by_hand_gives_clear_status(op, k, ns):
    # Valid for the CRD schema, invalid for the operator (the webhook would have refused it).
    k.create(ns, gms("handmade", extraArgs=["--tensor-parallel-size=4"]))
    cond = k.wait_condition(ns, "handmade", "Validated", "False", timeout=30)
    assert cond["reason"] == "InvalidSpec"
    assert "spec.extraArgs" in cond["message"] and "set spec.tensorParallelSize instead" in cond["message"]
    assert k.status(ns, "handmade")["phase"] == "Rejected"
    with pytest.raises(ApiException) as ei:
        k.deployment(ns, "handmade")
    assert ei.value.status == 404
    assert k.events(ns, "handmade", "InvalidSpec")


def test_known_crash_config_creates_nothing_and_says_why(op, k, ns):
    bad = gms(
        "corrupting",
        image={"tag": "v0.28.0", "vllmVersion": "0.28.0", "repository": "vllm/vllm-openai"},
        prefixCaching=True,  # set by the user: judged by the policy (unset, it resolves to false)
        admissionPolicy="reject",
    )
    k.create(ns, bad)
    cond = k.wait_condition(ns, "corrupting", "Validated", "False", timeout=30)
    assert cond["reason"] == "KnownIssue"
    assert "vllm#43559" in cond["message"] and "Nothing was created" in cond["message"]
    assert "prefixCaching" in cond["message"]
    st = k.status(ns, "corrupting")
    assert any(f["rule"] == "vllm#43559" and f["action"] == "rejected" for f in st["findings"])
    with pytest.raises(ApiException):
        k.deployment(ns, "corrupting")

    # The fix named in the message makes it run.
    k.patch(ns, "corrupting", {"spec": {"prefixCaching": False}})
    wait_for(lambda: k.deployment(ns, "corrupting"), 30, what="Deployment after the fix")
    k.wait_condition(ns, "corrupting", "Validated", "True", timeout=30)


def test_mitigate_policy_without_webhook_renders_the_mitigation(op, k, ns):
    obj = gms(
        "mitigated",
        image={"tag": "v0.28.0", "vllmVersion": "0.28.0", "repository": "vllm/vllm-openai"},
        admissionPolicy="mitigate",
        prefixCaching=True,
    )
    k.create(ns, obj)
    dep = wait_for(lambda: k.deployment(ns, "mitigated"), 30, what="Deployment")
    assert "--no-enable-prefix-caching" in args_of(dep)
    cond = k.wait_condition(ns, "mitigated", "Validated", timeout=30)
    assert cond["reason"] == "Mitigated"
    ov = wait_for(lambda: k.status(ns, "mitigated").get("overrides"), 30, what="status.overrides")
    assert [(o["path"], o["reason"], o["source"]) for o in ov] == [("prefixCaching", "vllm#43559", "mitigation")]
    assert k.get(ns, "mitigated")["spec"]["prefixCaching"] is True  # the spec is never written
