"""GDNGuard on the workloads of other serving stacks, on the real control plane (issue 35 items 3, 4, 5):

* a LeaderWorkerSet through the real LWS controller v0.9.0 (sigs.k8s.io/lws, tests/cluster/addons.py): its
  StatefulSets and pods made by the real controllers, the workload named by the pods' LWS label;
* KServe's LLMInferenceService from its real CRD (github.com/kserve/kserve v0.16.0 via the Go module proxy; no
  KServe controller runs here): the Deployment shaped as its controller makes it (pkg/controller/v1alpha1/llmisvc/
  workload_single_node.go: `<name>-kserve`, controlled by the LLMInferenceService, labelled
  app.kubernetes.io/part-of=llminferenceservice; the `main` container of config-llm-template.yaml, whose llm-d
  image tag is not a vLLM release: the guard pins it), guarded by label;
* the PolicyReport CRD (wgpolicyk8s.io/v1alpha2, sigs.k8s.io/wg-policy-prototypes): one report per namespace.

KAITO's Workspace is not here: the module proxy refuses every github.com/kaito-project/kaito version asked
(tests/cluster/build.sh). Crashes are real captured vLLM logs replayed as termination messages (kwok's crash
stage). managedFields prove the operator wrote nothing of theirs."""

from __future__ import annotations

import pytest

from builders import Workload
from guard_harness import GUARD, PLAIN, Guards, assert_not_written, install_guard_crd
from operator_harness import running_operator, wait_for
from test_crashwatch_cluster import tail

pytestmark = pytest.mark.timeout(420)

LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
LLMISVC = ("serving.kserve.io", "v1alpha1", "llminferenceservices")
SERVE = ["vllm", "serve", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--port", "8000", "--no-enable-prefix-caching",
         "--tensor-parallel-size", "2", "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']  # fmt: skip


@pytest.fixture(scope="module")
def stacks(full_cluster, kube_api, tmp_path_factory):
    from addons import KSERVE_LLMISVC_CRDS, POLICY_REPORT_CRDS, LWSController, find_addons, install_crds

    paths = find_addons(build=True)
    ctl = LWSController(full_cluster, paths, tmp_path_factory.mktemp("lws")).start()
    install_crds(kube_api, paths.kserve_src, KSERVE_LLMISVC_CRDS)
    install_crds(kube_api, paths.wgpolicy_src, POLICY_REPORT_CRDS)
    try:
        yield ctl
    finally:
        ctl.stop()


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, stacks, tmp_path_factory):
    install_guard_crd(kube_api)
    env = {"GDN_GUARD_INTERVAL": "2"}
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-guard-stacks"), env=env) as proc:
        yield proc


def crash(g: Guards, ns: str, pod: str, log: str, container: str) -> None:
    g.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {
        "gdn-operator.io/test-crash-message": tail(log), "gdn-operator.io/test-crash-container": container}}})  # fmt: skip


def test_leader_worker_set_through_the_real_controller(op, kube_api, ns):
    g = Guards(kube_api)
    leader = PLAIN.argv(SERVE).container()
    worker = PLAIN.argv([*SERVE[:3], "--headless", *SERVE[3:]]).container()
    lws = {
        "apiVersion": f"{LWS[0]}/{LWS[1]}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "lws-vllm"},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": {"metadata": {"labels": {"serving": "vllm"}}, "spec": {"containers": [leader]}},
                "workerTemplate": {"metadata": {"labels": {"serving": "vllm"}}, "spec": {"containers": [worker]}},
            },
        },
    }
    g.co.create_namespaced_custom_object(LWS[0], LWS[1], ns, LWS[2], lws)
    g.create(ns, GUARD.select({"serving": "vllm"}).obj())
    pods = g.running_pods(ns, "leaderworkerset.sigs.k8s.io/name=lws-vllm", n=2, timeout=120)
    w = wait_for(lambda: (g.workload(ns, "g", "LeaderWorkerSet", "lws-vllm") or {}).get("pods") == 2
                 and g.workload(ns, "g", "LeaderWorkerSet", "lws-vllm"), 60, what="the LWS in status")  # fmt: skip
    assert (w["vllmVersion"], w["versionSource"]) == ("0.32.0", "imageTag")
    worker_pod = next(p for p in pods if p.metadata.labels.get("leaderworkerset.sigs.k8s.io/worker-index") != "0")
    crash(g, ns, worker_pod.metadata.name, "b11-illegal-address-worker-tp4.tail.log", "vllm")
    f = g.finding(ns, "g", "LeaderWorkerSet", "lws-vllm", "CrashDiagnosed")
    assert f["pod"] == worker_pod.metadata.name and "illegal" in f["message"].lower(), f
    wait_for(lambda: g.events_on(ns, "LeaderWorkerSet", "lws-vllm", "EngineCrashed"), 15, what="Event on the LWS")
    assert_not_written(g, ns)
    lws_now = g.co.get_namespaced_custom_object(LWS[0], LWS[1], ns, LWS[2], "lws-vllm")
    assert not {"gdn-operator", "kopf"} & {m["manager"] for m in lws_now["metadata"]["managedFields"]}


def test_kserve_llm_inference_service_guarded_by_label_with_a_policy_report(op, kube_api, ns):
    g = Guards(kube_api)
    svc = g.co.create_namespaced_custom_object(*LLMISVC[:2], ns, LLMISVC[2], {
        "apiVersion": f"{LLMISVC[0]}/{LLMISVC[1]}", "kind": "LLMInferenceService", "metadata": {"name": "qwen"},
        "spec": {"model": {"uri": "hf://Qwen/Qwen3-Next-80B-A3B-Instruct", "name": "qwen"}}})  # fmt: skip
    labels = {
        "app.kubernetes.io/part-of": "llminferenceservice",
        "app.kubernetes.io/name": "qwen",
        "kserve.io/component": "workload",
    }
    # config-llm-template.yaml's main container; its launch line as the controller renders it (prefix caching default on)
    main = {"name": "main", "image": "ghcr.io/llm-d/llm-d-dev:v0.2.2", "command": ["vllm", "serve", "/mnt/models"],
            "args": ["--served-model-name", "qwen", "--port", "8000", "--disable-log-requests",
                     "--hf-overrides", '{"architectures":["Qwen3NextForCausalLM"]}',
                     "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'],
            "terminationMessagePolicy": "FallbackToLogsOnError"}  # fmt: skip
    owner = {"apiVersion": f"{LLMISVC[0]}/{LLMISVC[1]}", "kind": "LLMInferenceService", "name": "qwen",
             "uid": svc["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    dep = Workload("qwen-kserve").labelled(labels).replicas(1).meta(ownerReferences=[owner]).engine(**main).obj()
    g.apps.create_namespaced_deployment(ns, dep)
    # the llm-d image's tag is llm-d's release, not vLLM's: the guard pins the release it runs
    g.create(
        ns, GUARD.select({"app.kubernetes.io/part-of": "llminferenceservice"}).update(vllmVersion={"pinned": "0.30.0"}).obj()
    )
    (pod,) = g.running_pods(ns, "app.kubernetes.io/name=qwen")
    f = g.finding(ns, "g", "LLMInferenceService", "qwen", "KnownCrash")
    assert f["rule"] == "vllm#43559", f
    w = g.workload(ns, "g", "LLMInferenceService", "qwen")
    assert (w["vllmVersion"], w["versionSource"], w["pods"]) == ("0.30.0", "pinned", 1)
    crash(g, ns, pod.metadata.name, "b1-gdn-assert-tp2-interleaved.tail.log", "main")
    g.finding(ns, "g", "LLMInferenceService", "qwen", "CrashDiagnosed")
    ev = wait_for(lambda: g.events_on(ns, "LLMInferenceService", "qwen", "EngineCrashed"), 15, what="Event on the service")
    assert ev[0].involved_object.uid == svc["metadata"]["uid"]

    # the namespace's PolicyReport lists both findings against the LLMInferenceService
    def report():
        try:
            r = g.co.get_namespaced_custom_object("wgpolicyk8s.io", "v1alpha2", ns, "policyreports", "gdn-guard")
        except Exception:  # noqa: BLE001 - not written yet
            return None
        return r if {x["category"] for x in r.get("results") or []} >= {"KnownCrash", "CrashDiagnosed"} else None

    r = wait_for(report, 30, what="the PolicyReport with both findings")
    assert r["summary"]["fail"] == len(r["results"]) >= 2
    for res in r["results"]:
        assert res["policy"] == "gdn-guard/g" and res["result"] == "fail"
        (ref,) = res["resources"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("LLMInferenceService", "qwen", svc["metadata"]["uid"])
    assert_not_written(g, ns)
    svc_now = g.co.get_namespaced_custom_object(*LLMISVC[:2], ns, LLMISVC[2], "qwen")
    assert not {"gdn-operator", "kopf"} & {m["manager"] for m in svc_now["metadata"]["managedFields"]}
