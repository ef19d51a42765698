"""gdnctl on the scale-out examples: render shows the LeaderWorkerSet / HPA / ScaledObject / InferencePool,
validate refuses impossible node/GPU/TP splits with the field path (subprocess, as a user runs it)."""

import yaml

from test_cli import ROOT, run


def kinds(text):
    return [d["kind"] for d in yaml.safe_load_all(text)]


def test_render_two_node_example_shows_the_leader_worker_set():
    r = run("render", "-f", "examples/qwen3.5-397b-a17b-2node.yaml")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["kind"] for d in docs] == [
        "LeaderWorkerSet",
        "Service",
        "PodMonitor",
        "PodDisruptionBudget",
        "PersistentVolumeClaim",
    ]
    t = docs[0]["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "None"
    assert t["leaderTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_render_autoscaled_example_hpa_or_keda_and_pool():
    r = run("render", "-f", "examples/autoscaled.yaml")
    assert r.returncode == 0, r.stderr
    assert kinds(r.stdout) == [
        "Deployment",
        "Service",
        "PodMonitor",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "InferencePool",
    ]
    r = run("render", "-f", "examples/autoscaled.yaml", "--autoscaler", "keda", "--prometheus-address", "http://prom:9090")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    so = next(d for d in docs if d["kind"] == "ScaledObject")
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom:9090"
    r = run("render", "-f", "examples/autoscaled.yaml", "--autoscaler", "keda")
    assert r.returncode == 2 and "--prometheus-address" in r.stderr


def test_validate_refuses_impossible_splits_with_the_field_path(tmp_path):
    doc = yaml.safe_load((ROOT / "examples/qwen3.5-397b-a17b-2node.yaml").read_text())
    doc["spec"]["nodes"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    r = run("validate", "-f", str(bad))
    assert r.returncode == 2
    assert "spec.nodes: 3 nodes cannot split tensorParallelSize x pipelineParallelSize = 8 x 2 = 16 GPUs" in r.stderr
    doc["spec"]["nodes"] = 2
    doc["spec"]["resources"]["gpusPerNode"] = 4
    bad.write_text(yaml.safe_dump(doc))
    r = run("validate", "-f", str(bad))
    assert r.returncode == 2 and "spec.resources: gpusPerNode 4 x nodes 2" in r.stderr
    r = run("validate", "-f", "examples/qwen3.5-397b-a17b-2node.yaml")
    assert r.returncode == 0 and "PP=2, 2 nodes per engine" in r.stdout
