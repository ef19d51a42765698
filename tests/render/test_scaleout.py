"""Scale-out rendering: LeaderWorkerSet for multi-node engines, KEDA/HPA autoscalers, InferencePool,
graceful shutdown. Objects are checked for the wiring that makes them work, not just their presence."""

from __future__ import annotations

import pytest
import yaml

from gdn_operator.api.load import parse_spec
from gdn_operator.labels import LABEL_WORKER_INDEX
from gdn_operator.render import autoscale, shutdown
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.render.objects import render_all
from gdn_operator.render.scaleout import ScaleOutOptions, engine_args, workload_of

from builders import GMS

Q397 = GMS().update(model={"uri": "hf://Qwen/Qwen3.5-397B-A17B"})
TWO_NODES = Q397.update(tensorParallelSize=8, pipelineParallelSize=2, nodes=2)


def by_kind(objs):
    return {o["kind"]: o for o in objs}


def test_single_node_spec_still_renders_a_deployment():
    objs = by_kind(render_all("s", "ns", parse_spec(Q397.update(tensorParallelSize=2).spec())))
    assert set(objs) == {"Deployment", "Service", "PodMonitor", "PodDisruptionBudget"}
    assert objs["Deployment"]["spec"]["replicas"] == 1
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--nnodes" not in c["args"] and "--shutdown-timeout" not in c["args"] and "lifecycle" not in c


def test_two_node_engine_is_a_leader_worker_set_with_mp_launcher_wiring():
    objs = by_kind(render_all("q", "ns", parse_spec(TWO_NODES.spec()), "uid-1"))
    assert "Deployment" not in objs
    lw = objs["LeaderWorkerSet"]
    assert lw["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lw["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    t = lw["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and lw["spec"]["replicas"] == 1
    # lws#1048: no group recreation loop; the kubelet restarts in place with backoff
    assert t["restartPolicy"] == "None"
    # LeaderReady would deadlock: the leader is Ready only once every rank joined
    assert lw["spec"]["startupPolicy"] == "LeaderCreated"
    # LWS's default (Shared) makes a headless Service named like the LWS, i.e. like our engine Service "q":
    # per replica, LWS names each group's headless Service after its leader pod ("q-0")
    assert lw["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    assert objs["Service"]["metadata"]["name"] == lw["metadata"]["name"] == "q"
    leader, worker = (t[k]["spec"]["containers"][0] for k in ("leaderTemplate", "workerTemplate"))
    for c in (leader, worker):
        a = c["args"]
        assert a[a.index("--nnodes") + 1] == "2"
        assert a[a.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert a[a.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert a[a.index("--tensor-parallel-size") + 1] == "8" and a[a.index("--pipeline-parallel-size") + 1] == "2"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # 8 x 2 / 2 nodes
    assert "--headless" in worker["args"] and "--headless" not in leader["args"]
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    # same engine config on both nodes apart from the role
    assert [a for a in worker["args"] if a != "--headless"] == leader["args"]
    assert engine_args(list(objs.values())) == {tuple(leader["args"]), tuple(worker["args"])}


def test_api_objects_select_group_leaders_only():
    objs = by_kind(
        render_all("q", "ns", parse_spec(TWO_NODES.update(router={"inferencePool": {"endpointPicker": {"name": "epp"}}}).spec()))
    )
    for sel in (
        objs["Service"]["spec"]["selector"],
        objs["PodMonitor"]["spec"]["selector"]["matchLabels"],
        objs["InferencePool"]["spec"]["selector"]["matchLabels"],
    ):
        assert sel[LABEL_WORKER_INDEX] == "0"
    single = by_kind(render_all("s", "ns", parse_spec(Q397.spec())))
    assert LABEL_WORKER_INDEX not in single["Service"]["spec"]["selector"]


def test_inference_pool_targets_the_engine_port_and_the_epp():
    pool = by_kind(
        render_all(
            "s", "ns", parse_spec(Q397.update(router={"inferencePool": {"endpointPicker": {"name": "epp", "port": 9002}}}).spec())
        )
    )["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["targetPorts"] == [{"number": ENGINE_PORT}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert pool["spec"]["selector"]["matchLabels"]["serving.gdn-operator.io/server"] == "s"


AUTO = {"minReplicas": 2, "maxReplicas": 6, "metric": "num_requests_waiting", "target": 4, "scaleDownStabilizationSeconds": 120}


def test_hpa_scales_the_workload_not_the_server_and_owns_replicas():
    objs = by_kind(render_all("s", "ns", parse_spec(Q397.update(autoscaling=AUTO).spec())))
    assert "replicas" not in objs["Deployment"]["spec"]  # the autoscaler owns it via the scale subresource
    hpa = objs["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "s"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    m = hpa["spec"]["metrics"][0]
    assert m["type"] == "Pods" and m["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert m["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 120}}


def test_keda_scaled_object_queries_this_servers_series():
    objs = by_kind(
        render_all(
            "q",
            "ns",
            parse_spec(TWO_NODES.update(autoscaling={**AUTO, "metric": "kv_cache_usage_perc", "target": 0.8}).spec()),
            scaleout=ScaleOutOptions(keda=True, prometheus_address="http://prom:9090"),
        )
    )
    so = objs["ScaledObject"]
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "q"}
    trig = so["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and trig["metricType"] == "Value"  # a mean usage is not per engine
    assert trig["metadata"] == {
        "serverAddress": "http://prom:9090",
        "threshold": "0.8",
        "query": 'avg(vllm:kv_cache_usage_perc{namespace="ns",model_name="q"})',
    }
    assert "replicas" not in objs["LeaderWorkerSet"]["spec"]


def test_request_metrics_are_summed_and_targeted_per_engine():
    so = by_kind(
        render_all(
            "s",
            "ns",
            parse_spec(Q397.update(autoscaling=AUTO, model={"uri": "hf://Qwen/Qwen3.5-27B", "servedName": "q35"}).spec()),
            scaleout=ScaleOutOptions(keda=True, prometheus_address="http://p:9090"),
        )
    )["ScaledObject"]
    t = so["spec"]["triggers"][0]
    assert t["metricType"] == "AverageValue" and t["metadata"]["query"].startswith(
        'sum(vllm:num_requests_waiting{namespace="ns",model_name="q35"})'
    )


@pytest.mark.parametrize("keda", [False, True])
def test_crash_loop_pauses_scale_up_only(keda):
    opts = ScaleOutOptions(keda=keda, prometheus_address="http://p:9090", scale_up_paused=True)
    scaler = render_all("s", "ns", parse_spec(Q397.update(autoscaling=AUTO).spec()), scaleout=opts)[-1]
    assert autoscale.scale_up_paused(scaler)
    calm = render_all(
        "s",
        "ns",
        parse_spec(Q397.update(autoscaling=AUTO).spec()),
        scaleout=ScaleOutOptions(keda=keda, prometheus_address="http://p:9090"),
    )[-1]
    assert not autoscale.scale_up_paused(calm)


def test_graceful_drain_wires_prestop_grace_and_shutdown_timeout():
    dep = by_kind(render_all("s", "ns", parse_spec(Q397.update(autoscaling=AUTO).spec())))["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    n = int(c["args"][c["args"].index("--shutdown-timeout") + 1])
    assert n == shutdown.AUTOSCALING_DEFAULT_DRAIN
    pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre + n  # vllm PR #43208: grace > preStop + drain
    explicit = by_kind(render_all("s", "ns", parse_spec(Q397.update(shutdownTimeoutSeconds=120).spec())))["Deployment"]["spec"][
        "template"
    ]["spec"]
    assert explicit["terminationGracePeriodSeconds"] > 120 + pre


def test_autoscaling_on_a_vllm_without_shutdown_timeout_renders_no_flag():
    dep = by_kind(
        render_all("s", "ns", parse_spec(Q397.update(autoscaling=AUTO, image={"tag": "x", "vllmVersion": "0.17.1"}).spec()))
    )["Deployment"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--shutdown-timeout" not in c["args"] and "lifecycle" not in c


def test_feature_floors_agree_with_the_rules():
    from gdn_operator.rules import load_rules

    rules = {r.id: r for r in load_rules().rules}
    f = shutdown.features()
    assert rules["vllm-config/shutdown-timeout-unsupported"].versions == f"<{f['shutdown_timeout'].since}"
    assert rules["vllm-config/multi-node-launcher"].versions == f"<{f['multi_node_mp'].since}"


@pytest.mark.parametrize(
    "entry",
    [
        {"since": "latest", "evidence": "e"},  # not a vLLM version: would have turned the feature off silently
        {"since": "0.18.0", "evidence": "e", "sinse": "0.19.0"},  # a misspelt key
        {"since": "0.18.0"},  # no evidence
    ],
)
def test_a_malformed_feature_entry_fails_the_load(entry):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        shutdown.Feature.model_validate(entry)
    assert shutdown.Feature.model_validate({"since": "0.18.0", "evidence": "e"}).since == "0.18.0"


def test_examples_render_their_scale_out_objects():
    from pathlib import Path

    from gdn_operator.api.load import load_file

    root = Path(__file__).resolve().parents[2] / "examples"
    two = load_file(str(root / "qwen3.5-397b-a17b-2node.yaml"))[0]
    kinds = [o["kind"] for o in render_all(two.metadata.name, "default", two.spec)]
    assert kinds[0] == "LeaderWorkerSet" and "Deployment" not in kinds
    auto = load_file(str(root / "autoscaled.yaml"))[0]
    kinds = [o["kind"] for o in render_all(auto.metadata.name, "default", auto.spec)]
    assert {"HorizontalPodAutoscaler", "InferencePool"} <= set(kinds)
    yaml.safe_dump_all(render_all(auto.metadata.name, "default", auto.spec))  # serialisable
    assert workload_of(render_all(auto.metadata.name, "default", auto.spec))["kind"] == "Deployment"
