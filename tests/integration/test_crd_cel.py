"""The CRD's own validation on the real kube-apiserver, with no admission webhook (issue 38 item 5): the CEL
rules (x-kubernetes-validations) generated from the pydantic models refuse what their validators refuse —
so `kubectl apply --dry-run=server`, and a cluster whose webhook is down, learn the field-local invariants —
and admit every example; the scale subresource carries status.selector (labelSelectorPath); conditions are a
map keyed by type (two field managers' conditions merge under server-side apply)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.api.load import ManifestError, parse_spec
from operator_harness import CLUSTER_SERVER, Kube, install_crd

ROOT = Path(__file__).resolve().parents[2]
HF = "hf://Qwen/Qwen3.5-27B"


@pytest.fixture(scope="module")
def cluster(kube_api):
    install_crd(kube_api)
    core = kubernetes.client.CoreV1Api(kube_api)
    ns = f"cel-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        yield Kube(kube_api), ns
    finally:
        core.delete_namespace(ns)


def dry_run_create(k: Kube, ns: str, obj: dict) -> str | None:
    """None when the API server admits `obj` (a dry run: nothing stored), else its message."""
    try:
        k.co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, dry_run="All")
    except ApiException as e:
        assert e.status == 422, e.body
        return json.loads(e.body)["message"]
    return None


def server(**spec) -> dict:
    return CLUSTER_SERVER.name(f"s-{uuid.uuid4().hex[:6]}").merge(**spec).obj()


# (spec fields merged into the cluster tests' server, the CRD's message)
REFUSED = [
    ({"model": {"uri": "oci://registry.example/qwen:1"}}, "oci:// model images have no loader"),
    ({"model": {"uri": "pvc://weights/qwen", "revision": "main"}}, "revision applies to hf:// models"),
    ({"model": {"uri": "pvc://weights/qwen", "hubEndpoint": "https://m.example"}}, "hubEndpoint applies to hf:// models"),
    (
        {"model": {"uri": "pvc://weights/qwen", "cache": {"persistentVolumeClaim": {"size": "1Ti"}}}},
        "cache.persistentVolumeClaim applies to hf:// models",
    ),
    ({"model": {"uri": HF, "cache": {"persistentVolumeClaim": {}}}}, "exactly one"),
    ({"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "c", "size": "1Ti"}}}}, "exactly one"),
    (
        {"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "c", "storageClassName": "nfs"}}}},
        "storageClassName applies to a claim the operator creates",
    ),
    (
        {"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "c", "retainPolicy": "Delete"}}}},
        "retainPolicy applies to a claim the operator creates",
    ),
    ({"model": {"uri": HF, "cache": {"emptyDir": {}, "persistentVolumeClaim": {"size": "1Ti"}}}}, "not both"),
    ({"model": {"uri": HF, "cache": {"include": []}}}, "an empty include fetches nothing"),
    ({"replicas": 2, "autoscaling": {"maxReplicas": 4, "target": 5}}, "mutually exclusive"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 4, "target": 5}}, "minReplicas is above maxReplicas"),
    (
        {"autoscaling": {"maxReplicas": 4, "metric": "kv_cache_usage_perc", "target": 80}},
        "must be a fraction between 0 and 1",
    ),
    ({"tensorParallelSize": 3, "nodes": 2}, "nodes must divide"),
    ({"cudagraphMode": "FULL", "enforceEager": True}, "enforceEager: true disables CUDA graphs"),
    ({"tensorParallelSize": 4, "nodes": 2, "resources": {"gpusPerNode": 4}}, "gpusPerNode x nodes must equal"),
    ({"metrics": {"scrapeIntervalSeconds": 30}, "health": {"stallSeconds": 45}}, "must span at least two scrapes"),
    (
        {
            "replicas": 2,
            "model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "c", "accessMode": "ReadWriteOnce"}}},
        },
        "cannot serve several replicas or nodes",
    ),
]


def _spec_of(fields: dict) -> dict:
    obj = server(**fields)
    if "autoscaling" in fields and "replicas" not in fields:
        obj["spec"].pop("replicas", None)
    return obj


@pytest.mark.parametrize(("fields", "message"), REFUSED, ids=[m for _f, m in REFUSED])
def test_the_api_server_refuses_what_the_webhook_refuses(cluster, fields, message):
    k, ns = cluster
    obj = _spec_of(fields)
    with pytest.raises(ManifestError):  # the rule restates a validator: the webhook refuses it too
        parse_spec(obj["spec"])
    got = dry_run_create(k, ns, obj)
    assert got is not None and message in got, got


@pytest.mark.parametrize(
    "fields",
    [
        {"model": {"uri": HF, "revision": "0123456789abcdef0123456789abcdef01234567", "cache": {"include": ["*"]}}},
        {"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "shared"}}}},
        {"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"size": "1Ti", "retainPolicy": "Delete"}}}},
        {"autoscaling": {"minReplicas": 2, "maxReplicas": 4, "metric": "kv_cache_usage_perc", "target": 0.8}},
        {"tensorParallelSize": 4, "nodes": 2, "resources": {"gpusPerNode": 2}},
        {"cudagraphMode": "NONE", "enforceEager": True},
        {"metrics": {"enabled": False, "scrapeIntervalSeconds": 30}, "health": {"stallSeconds": 45}},
        {"model": {"uri": HF, "cache": {"persistentVolumeClaim": {"claimName": "c", "accessMode": "ReadWriteOnce"}}}},
        {"model": {"uri": "pvc://weights/qwen"}},
    ],
)
def test_the_api_server_admits_what_the_webhook_admits(cluster, fields):
    k, ns = cluster
    obj = _spec_of(fields)
    parse_spec(obj["spec"])
    assert dry_run_create(k, ns, obj) is None


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_passes_the_crd(cluster, path):
    k, ns = cluster
    for doc in yaml.safe_load_all(path.read_text()):
        doc["metadata"]["namespace"] = ns
        assert dry_run_create(k, ns, doc) is None


def test_scale_subresource_selector_and_conditions_merged_by_type(cluster):
    k, ns = cluster
    obj = server(replicas=1)
    name = obj["metadata"]["name"]
    k.create(ns, obj)
    selector = f"app.kubernetes.io/managed-by=gdn-operator,serving.gdn-operator.io/server={name}"
    k.co.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        name,
        {"status": {"replicas": 1, "selector": selector}},
        _content_type="application/merge-patch+json",
    )
    scale = k.co.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, name)
    assert scale["status"] == {"replicas": 1, "selector": selector}  # what an HPA on the server reads pods by

    def apply(manager: str, type_: str) -> dict:
        cond = {"type": type_, "status": "True", "reason": "R", "message": manager, "lastTransitionTime": "2026-01-01T00:00:00Z"}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GDNModelServer",
            "metadata": {"name": name},
            "status": {"conditions": [cond]},
        }
        return k.co.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            body,
            field_manager=manager,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    apply("writer-a", "Ready")
    out = apply("writer-b", "Stalled")  # listType map: b's condition joins a's instead of replacing the list
    assert sorted(c["type"] for c in out["status"]["conditions"]) == ["Ready", "Stalled"]
