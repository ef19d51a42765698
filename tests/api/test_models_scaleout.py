"""Scale-out fields of the API: impossible node/GPU/TP combinations and replicas+autoscaling are refused
with the field path and the fix (what `gdnctl validate` and the webhook print)."""

from __future__ import annotations

import pytest

from gdn_operator.api.load import ManifestError, parse_spec

BASE = {"model": {"uri": "hf://Qwen/Qwen3.5-397B-A17B"}, "image": {"tag": "x", "vllmVersion": "0.33.0"}}


def problems(**kw):
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, **kw})
    return e.value.problems


def test_two_nodes_of_eight_gpus():
    s = parse_spec({**BASE, "tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2, "resources": {"gpusPerNode": 8}})
    assert s.gpus_per_pod == 8 and s.nodes == 2


@pytest.mark.parametrize(
    "kw, path, hint",
    [
        ({"tensorParallelSize": 8, "nodes": 3}, "spec.nodes:", "use nodes in [1, 2, 4, 8]"),
        ({"tensorParallelSize": 2, "pipelineParallelSize": 3, "nodes": 4}, "spec.nodes:", "2 x 3 = 6 GPUs"),
        (
            {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2, "resources": {"gpusPerNode": 4}},
            "spec.resources:",
            "gpusPerNode 4 x nodes 2 = 8 GPUs, but tensorParallelSize x pipelineParallelSize = 8 x 2 = 16",
        ),
        ({"tensorParallelSize": 4, "resources": {"gpusPerNode": 8}}, "spec.resources:", "nodes 1"),
        ({"nodes": 0}, "spec.nodes:", "greater than or equal to 1"),
    ],
)
def test_impossible_node_gpu_tp_combinations(kw, path, hint):
    (p,) = problems(**kw)
    assert p.startswith(path) and hint in p


def test_replicas_and_autoscaling_are_mutually_exclusive():
    (p,) = problems(replicas=2, autoscaling={"maxReplicas": 4, "target": 3})
    assert "mutually exclusive" in p and "spec.replicas" in p
    s = parse_spec({**BASE, "autoscaling": {"maxReplicas": 4, "target": 3}})
    assert "replicas" not in s.model_fields_set and s.autoscaling.min_replicas == 1


@pytest.mark.parametrize(
    "auto, hint",
    [
        ({"minReplicas": 5, "maxReplicas": 2, "target": 1}, "minReplicas 5 is above maxReplicas 2"),
        ({"maxReplicas": 2, "metric": "kv_cache_usage_perc", "target": 80}, "fraction between 0 and 1"),
        ({"maxReplicas": 2, "metric": "gpu_util", "target": 1}, "num_requests_waiting"),
        ({"maxReplicas": 2}, "spec.autoscaling.target: required"),
    ],
)
def test_autoscaling_bounds(auto, hint):
    (p,) = problems(autoscaling=auto)
    assert p.startswith("spec.autoscaling") and hint in p


@pytest.mark.parametrize(
    "flag",
    [
        "--nnodes=2",
        "-n",
        "--node-rank=1",
        "--master-addr=x",
        "--headless",
        "--pipeline-parallel-size=2",
        "-pp",
        "--shutdown-timeout=5",
        "--distributed-executor-backend=ray",
    ],
)
def test_multinode_flags_are_operator_owned(flag):
    (p,) = problems(extraArgs=[flag])
    assert p.startswith("spec.extraArgs") and "which the operator owns" in p


def test_lws_env_cannot_be_overridden():
    (p,) = problems(env=[{"name": "LWS_WORKER_INDEX", "value": "0"}])
    assert "LeaderWorkerSet controller" in p


def test_inference_pool_epp_is_validated():
    (p,) = problems(router={"inferencePool": {"endpointPicker": {"name": "EPP_svc"}}})
    assert p.startswith("spec.router.inferencePool.endpointPicker.name")
    (p,) = problems(router={"inferencePool": {"endpointPicker": {"name": "epp", "failureMode": "Open"}}})
    assert "FailOpen or FailClose" in p


def test_crd_has_no_replicas_default():
    from gdn_operator.api.crd import crd_manifest

    props = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "default" not in props["replicas"]  # a stored default would collide with autoscaling
    assert props["nodes"]["default"] == 1 and props["autoscaling"]["nullable"] is True
