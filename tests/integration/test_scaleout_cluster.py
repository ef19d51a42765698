"""Scale-out on the real control plane (issue 17).

Real controllers: kube-apiserver, kube-controller-manager (StatefulSets, Deployments, garbage collector,
the HPA controller), kube-scheduler, kwok nodes, and the real LeaderWorkerSet controller v0.9.0 built from
sigs.k8s.io/lws with its webhooks (tests/cluster/addons.py). KEDA and the Gateway API Inference Extension
run no controller here: their real CRDs (from their Go modules) validate what the operator applies, and
the tests write the InferencePool status a gateway would write.
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from operator_harness import gms, running_operator, wait_for

LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
POOL = ("inference.networking.k8s.io", "v1", "inferencepools")
B1 = 'AssertionError: num_decodes: 1, num_spec_decodes: 4\n  File "vllm/v1/attention/backends/gdn_attn.py", line 312, in build'
NCCL = "RuntimeError: NCCL communicator was aborted on rank 0."


@pytest.fixture(scope="module")
def addons(full_cluster, tmp_path_factory):
    from addons import GIE_CRDS, KEDA_CRDS, LWSController, find_addons, install_crds

    paths = find_addons(build=True)
    ctl = LWSController(full_cluster, paths, tmp_path_factory.mktemp("lws")).start()
    with full_cluster.api_client() as api:
        install_crds(api, paths.keda_src, KEDA_CRDS)
        install_crds(api, paths.gie_src, GIE_CRDS)
    try:
        yield ctl
    finally:
        ctl.stop()


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, addons, tmp_path_factory):
    # crash conditions clear fast enough for the pause/resume test; group incidents as in production
    env = {"GDN_CRASH_QUIET_SECONDS": "600"}
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-scaleout"), env=env) as proc:
        yield proc


def lws_obj(k, ns, name):
    return k.co.get_namespaced_custom_object(*LWS[:2], ns, LWS[2], name)


def group_pods(k, ns, name):
    pods = [p for p in k.engine_pods(ns, name) if not p.metadata.deletion_timestamp]
    leaders = [p for p in pods if (p.metadata.labels or {}).get("leaderworkerset.sigs.k8s.io/worker-index") == "0"]
    workers = [p for p in pods if (p.metadata.labels or {}).get("leaderworkerset.sigs.k8s.io/worker-index") not in (None, "0")]
    return leaders, workers


def ready(k, ns, name, want="1/1"):
    def check():
        s = k.status(ns, name)
        c = next((c for c in s.get("conditions") or [] if c["type"] == "Ready"), None)
        return s if c and c["status"] == "True" and s.get("ready") == want else None

    return wait_for(check, 120, what=f"{ns}/{name} Ready {want}")


def env_of(pod):
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def test_multinode_engine_runs_as_a_real_leader_worker_set(op, k, ns, addons):
    k.create(ns, gms("mn", tensorParallelSize=2, nodes=2))
    st = ready(k, ns, "mn")
    assert st["workload"] == "LeaderWorkerSet" and st["groupSize"] == 2
    cond = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert "1/1 engine groups (2 pods each) ready" in cond["message"]
    lw = lws_obj(k, ns, "mn")
    assert lw["status"]["readyReplicas"] == 1  # counted by the LWS controller: all pods of the group ready
    leaders, workers = group_pods(k, ns, "mn")
    assert len(leaders) == 1 and len(workers) == 1
    # the real LWS pod webhook injected the rendezvous variables the args refer to
    le, we = env_of(leaders[0]), env_of(workers[0])
    assert le["LWS_WORKER_INDEX"] == "0" and we["LWS_WORKER_INDEX"] == "1"
    assert le["LWS_LEADER_ADDRESS"] == we["LWS_LEADER_ADDRESS"] and le["LWS_LEADER_ADDRESS"].startswith("mn-0.")
    assert "$(LWS_LEADER_ADDRESS)" in leaders[0].spec.containers[0].args
    assert "--headless" in workers[0].spec.containers[0].args and "--headless" not in leaders[0].spec.containers[0].args
    # the API Service reaches the leader only
    svc = k.core.read_namespaced_service("mn", ns)
    assert svc.spec.selector["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_update_rolls_the_group_and_delete_collects_it(op, k, ns, addons):
    k.create(ns, gms("roll", tensorParallelSize=2, nodes=2))
    ready(k, ns, "roll")
    old = {p.metadata.uid for p in k.engine_pods(ns, "roll")}
    k.patch(ns, "roll", {"spec": {"speculativeDecoding": {"numSpeculativeTokens": 3}}})

    def rolled():
        leaders, workers = group_pods(k, ns, "roll")
        new = [p for p in leaders + workers if p.metadata.uid not in old]
        args_ok = all('"num_speculative_tokens":3' in " ".join(p.spec.containers[0].args) for p in new)
        return len(new) == 2 and args_ok and len(leaders) == 1 and len(workers) == 1

    wait_for(rolled, 180, what="the LeaderWorkerSet rolled both pods of the group to the new spec")
    st = ready(k, ns, "roll")
    assert st["observedGeneration"] == k.get(ns, "roll")["metadata"]["generation"]
    k.delete(ns, "roll")
    # the garbage collector (kube-controller-manager) removes the LWS and, through it, the group's pods
    wait_for(lambda: _gone(lambda: lws_obj(k, ns, "roll")), 90, what="LeaderWorkerSet garbage-collected")
    wait_for(lambda: not k.engine_pods(ns, "roll"), 90, what="group pods gone")


def _gone(read):
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def test_switching_nodes_replaces_the_deployment_with_a_leader_worker_set(op, k, ns, addons):
    k.create(ns, gms("sw", tensorParallelSize=2))
    ready(k, ns, "sw")
    assert k.status(ns, "sw")["workload"] == "Deployment"
    k.patch(ns, "sw", {"spec": {"nodes": 2}})
    wait_for(lambda: _gone(lambda: k.deployment(ns, "sw")), 60, what="old Deployment pruned")
    wait_for(lambda: k.status(ns, "sw").get("workload") == "LeaderWorkerSet", 60, what="status from the LeaderWorkerSet")
    st = ready(k, ns, "sw")
    assert st["groupSize"] == 2
    assert [e for e in k.events(ns, "sw", "DriftCorrected")] == []  # the pruned kind is not "restored"


def test_worker_crash_in_a_group_is_diagnosed_once(op, k, ns, addons):
    from test_crashwatch_cluster import crash

    k.create(ns, gms("wc", tensorParallelSize=2, nodes=2, remediation={"mode": "none"}))
    ready(k, ns, "wc")
    leaders, workers = group_pods(k, ns, "wc")
    uids = {p.metadata.uid for p in leaders + workers}
    crash(k, ns, workers[0].metadata.name, B1)
    lc = wait_for(
        lambda: (
            (k.status(ns, "wc").get("lastCrash") or {}).get("pod") == workers[0].metadata.name and k.status(ns, "wc")["lastCrash"]
        ),
        30,
        what="worker crash in status",
    )
    assert lc["signature"] == "gdn-mixed-spec-decode-assert" and lc["upstream"] == "vllm#36917"
    assert lc["group"] == "wc/0" and lc["count"] == 1
    # the leader's engine dies with it (its peer is gone): the same incident, counted once
    crash(k, ns, leaders[0].metadata.name, NCCL)
    lc = wait_for(
        lambda: (
            (k.status(ns, "wc").get("lastCrash") or {}).get("pod") == leaders[0].metadata.name and k.status(ns, "wc")["lastCrash"]
        ),
        30,
        what="leader crash in status",
    )
    assert lc["count"] == 1 and lc["signature"] == "gdn-mixed-spec-decode-assert"
    ev = [e.message for e in k.events(ns, "wc", "EngineCrashed")]
    assert any("Engine group wc/0" in m and "counted once" in m for m in ev), ev
    # restartPolicy None: the LWS controller restarted nothing, the kubelet (kwok) restarted in place
    assert {p.metadata.uid for p in k.engine_pods(ns, "wc") if not p.metadata.deletion_timestamp} == uids


def test_scale_event_on_an_autoscaled_server(op, k, ns, addons):
    k.create(ns, gms("auto", autoscaling={"minReplicas": 1, "maxReplicas": 3, "target": 4}))
    ready(k, ns, "auto")
    from kubernetes import client

    hpa = client.AutoscalingV2Api(k.api)
    h = wait_for(lambda: hpa.read_namespaced_horizontal_pod_autoscaler("auto", ns), 30, what="HPA")
    assert h.spec.scale_target_ref.kind == "Deployment" and h.spec.metrics[0].pods.metric.name == "vllm_num_requests_waiting"
    # the real HPA controller picked it up (it cannot read the metric here: no custom metrics API)
    wait_for(
        lambda: any(
            c.type == "AbleToScale" for c in (hpa.read_namespaced_horizontal_pod_autoscaler("auto", ns).status.conditions or [])
        ),
        60,
        what="HPA controller reconciled the HPA",
    )
    dep = k.deployment(ns, "auto")
    assert "--shutdown-timeout" in dep.spec.template.spec.containers[0].args
    assert dep.spec.template.spec.containers[0].lifecycle.pre_stop.sleep.seconds > 0
    # a scale event through the scale subresource, exactly as the HPA controller writes it
    k.apps.patch_namespaced_deployment_scale("auto", ns, {"spec": {"replicas": 2}})
    ready(k, ns, "auto", "2/2")
    # a later reconcile (spec change) must not take the replicas back: the operator does not own them
    k.patch(ns, "auto", {"spec": {"maxNumSeqs": 64}})
    wait_for(
        lambda: k.status(ns, "auto").get("observedGeneration") == k.get(ns, "auto")["metadata"]["generation"],
        30,
        what="reconciled",
    )
    wait_for(lambda: "64" in k.deployment(ns, "auto").spec.template.spec.containers[0].args, 30, what="new template")
    assert k.deployment(ns, "auto").spec.replicas == 2


def test_crash_loop_pauses_scale_up(op, k, ns, addons):
    from kubernetes import client
    from test_crashwatch_cluster import crash, running_pod

    k.create(ns, gms("loop", autoscaling={"minReplicas": 1, "maxReplicas": 3, "target": 4}, remediation={"mode": "none"}))
    hpa = client.AutoscalingV2Api(k.api)
    wait_for(lambda: hpa.read_namespaced_horizontal_pod_autoscaler("loop", ns), 60, what="HPA")
    pod = running_pod(k, ns, "loop")
    crash(k, ns, pod.metadata.name, B1)
    crash(k, ns, pod.metadata.name, B1)
    k.wait_condition(ns, "loop", "CrashLooping", "True", timeout=30)

    def paused():
        b = hpa.read_namespaced_horizontal_pod_autoscaler("loop", ns).spec.behavior
        return b is not None and b.scale_up is not None and b.scale_up.select_policy == "Disabled"

    wait_for(paused, 30, what="HPA scale-up disabled while CrashLooping")
    assert k.events(ns, "loop", "ScaleUpPaused")


def test_lws_scale_event_counts_groups(op, k, ns, addons):
    k.create(ns, gms("lwsauto", tensorParallelSize=2, nodes=2, autoscaling={"minReplicas": 1, "maxReplicas": 2, "target": 2}))
    ready(k, ns, "lwsauto")
    lw = lws_obj(k, ns, "lwsauto")
    assert "replicas" in lw["spec"]  # defaulted by the LWS CRD, owned by nobody from the operator
    k.co.patch_namespaced_custom_object_scale(*LWS[:2], ns, LWS[2], "lwsauto", {"spec": {"replicas": 2}})
    st = ready(k, ns, "lwsauto", "2/2")
    assert st["replicas"] == 2 and len(k.engine_pods(ns, "lwsauto")) == 4


def test_inference_pool_applied_and_its_conditions_mirrored(op, k, ns, addons):
    k.create(ns, gms("pool", router={"inferencePool": {"endpointPicker": {"name": "pool-epp"}}}))
    p = wait_for(lambda: k.co.get_namespaced_custom_object(*POOL[:2], ns, POOL[2], "pool"), 30, what="InferencePool")
    assert p["spec"]["targetPorts"] == [{"number": 8000}]
    assert p["spec"]["endpointPickerRef"]["name"] == "pool-epp"
    # what a GIE gateway controller writes (none runs here)
    p["status"] = {
        "parents": [
            {
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
                "conditions": [
                    {
                        "type": "Accepted",
                        "status": "True",
                        "reason": "Accepted",
                        "message": "ok",
                        "lastTransitionTime": "2026-11-23T10:00:00Z",
                        "observedGeneration": 1,
                    },
                    {
                        "type": "ResolvedRefs",
                        "status": "False",
                        "reason": "InvalidExtensionRef",
                        "message": "Service pool-epp not found",
                        "lastTransitionTime": "2026-11-23T10:00:00Z",
                        "observedGeneration": 1,
                    },
                ],
            }
        ]
    }
    k.co.replace_namespaced_custom_object_status(*POOL[:2], ns, POOL[2], "pool", p)
    k.wait_condition(ns, "pool", "InferencePoolAccepted", "True", timeout=30)
    c = k.wait_condition(ns, "pool", "InferencePoolResolvedRefs", "False", timeout=30)
    assert c["reason"] == "InvalidExtensionRef" and "pool-epp" in c["message"]
    # dropping the router removes the pool
    k.patch(ns, "pool", {"spec": {"router": None}})
    wait_for(lambda: _gone(lambda: k.co.get_namespaced_custom_object(*POOL[:2], ns, POOL[2], "pool")), 30, what="pool pruned")


def test_keda_scaled_object_is_accepted_by_the_real_crd(k, ns, addons):
    """The KEDA path against KEDA's own CRD (server-side apply; no KEDA controller runs here)."""
    from gdn_operator.api.load import parse_spec
    from gdn_operator.render.objects import render_all
    from gdn_operator.render.scaleout import ScaleOutOptions

    spec = parse_spec(gms("k", autoscaling={"minReplicas": 1, "maxReplicas": 4, "target": 4})["spec"])
    so = next(
        o
        for o in render_all(
            "k", ns, spec, scaleout=ScaleOutOptions(keda=True, prometheus_address="http://prom:9090", scale_up_paused=True)
        )
        if o["kind"] == "ScaledObject"
    )
    import json

    got = json.loads(
        k.co.patch_namespaced_custom_object(
            "keda.sh",
            "v1alpha1",
            ns,
            "scaledobjects",
            "k",
            so,
            field_manager="test",
            _content_type="application/apply-patch+yaml",
            _preload_content=False,
        ).data
    )
    assert got["spec"]["triggers"] == so["spec"]["triggers"]  # nothing pruned by the structural schema
    assert got["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled"
    # and the schema is really enforced: a wrong type is refused by validation
    bad = {**so, "metadata": {**so["metadata"], "name": "k2"}, "spec": {**so["spec"], "minReplicaCount": "one"}}
    with pytest.raises(ApiException) as e:
        k.co.create_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", bad, dry_run="All")
    assert e.value.status == 422 and "minReplicaCount" in e.value.body


def test_group_crash_loop_is_remediated_once_per_generation(op, k, ns, addons):
    """lws#1048's loop, the way it looks with restartPolicy None: the same worker crash again and again,
    each time taking the leader down too. Three group crashes (six pod deaths) remediate exactly once — as an
    operator override (status.overrides) that the LeaderWorkerSet renders; the spec is never written."""
    from test_crashwatch_cluster import crash, tail

    # asyncScheduling set on: the value the remediation changes (left unset, the safe default is already off)
    k.create(ns, gms("grp", tensorParallelSize=2, nodes=2, asyncScheduling=True, remediation={"mode": "auto", "threshold": 3}))
    ready(k, ns, "grp")
    leaders, workers = group_pods(k, ns, "grp")
    message = tail("b9-np-repeat-negative.tail.log")
    for i in range(3):
        crash(k, ns, workers[0].metadata.name, message)
        if i < 2:  # the third worker crash reaches the threshold and remediates at once
            wait_for(lambda: (k.status(ns, "grp").get("lastCrash") or {}).get("pod") == workers[0].metadata.name, 30)
            crash(k, ns, leaders[0].metadata.name, NCCL)
            wait_for(lambda: (k.status(ns, "grp").get("lastCrash") or {}).get("pod") == leaders[0].metadata.name, 30)
            assert k.status(ns, "grp")["lastCrash"]["count"] == i + 1  # the leader's death did not count

    def overridden():
        o = k.get(ns, "grp")
        ov = [x for x in (o.get("status") or {}).get("overrides") or [] if x.get("path") == "asyncScheduling"]
        return o if ov and ov[0]["value"] is False and ov[0]["source"] == "remediation" else None

    obj = wait_for(overridden, 30, what="the asyncScheduling=false override")
    rem = obj["status"]["remediations"]
    assert len(rem) == 1 and rem[0]["signature"] == "spec-decode-negative-repeat" and rem[0]["generation"] == 1
    assert obj["metadata"]["generation"] == 1 and obj["spec"]["asyncScheduling"] is True  # the spec is never written
    # the LeaderWorkerSet rolls the group to the override
    lw = wait_for(
        lambda: (
            (o := lws_obj(k, ns, "grp"))
            and "--no-async-scheduling" in o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
            and o
        ),
        30,
    )
    assert "--no-async-scheduling" in lw["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]


def test_deleted_leader_worker_set_is_restored(op, k, ns, addons):
    k.create(ns, gms("drift", tensorParallelSize=2, nodes=2))
    ready(k, ns, "drift")
    # the engine Service is ours, and LWS's per-group headless Service (named after the leader pod) exists
    # beside it: with LWS's Shared subdomain both wanted the name "drift" (two controller owners, apply refused)
    group_svc = wait_for(lambda: _svc_or_none(k, ns, "drift-0"), 60, what="LWS headless Service drift-0")
    assert group_svc.spec.cluster_ip == "None"
    assert [(r.kind, r.controller) for r in k.core.read_namespaced_service("drift", ns).metadata.owner_references] == [
        ("GDNModelServer", True)
    ]
    uid = lws_obj(k, ns, "drift")["metadata"]["uid"]
    k.co.delete_namespaced_custom_object(*LWS[:2], ns, LWS[2], "drift")
    wait_for(
        lambda: (o := _lws_or_none(k, ns, "drift")) is not None and o["metadata"]["uid"] != uid,
        60,
        what="LeaderWorkerSet re-created by the operator",
    )
    ev = wait_for(lambda: k.events(ns, "drift", "DriftCorrected"), 30, what="DriftCorrected event")
    assert "Engine LeaderWorkerSet was deleted" in ev[0].message
    ready(k, ns, "drift")
    assert not k.events(ns, "drift", "ApplyRefused"), "an apply was refused"


def _svc_or_none(k, ns, name):
    try:
        return k.core.read_namespaced_service(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _lws_or_none(k, ns, name):
    try:
        return lws_obj(k, ns, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
