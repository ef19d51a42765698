"""The committed CRD is exactly what `gdnctl crd` generates from the models, and it is structural."""

from pathlib import Path

import yaml

from gdn_operator.api.crd import CRD_RELATIVE_PATH, crd_manifest, crd_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_generated():
    committed = (ROOT / CRD_RELATIVE_PATH).read_text()
    assert committed == crd_yaml(), "run `gdnctl crd > charts/gdn-operator/files/crds/...yaml` and commit it"


def _walk(node, path="schema"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    forbidden = {"$ref", "anyOf", "oneOf", "allOf", "title", "const", "$defs"}
    for path, node in _walk(schema):
        assert not (forbidden & set(node)), f"{path} has {forbidden & set(node)}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node


def test_schema_carries_defaults_enums_and_bounds():
    spec = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert set(spec["required"]) == {"model", "image"}
    assert props["tensorParallelSize"] == {
        **props["tensorParallelSize"],
        "type": "integer",
        "minimum": 1,
        "maximum": 64,
        "default": 1,
    }
    sd = props["speculativeDecoding"]
    assert sd["default"] == {}
    assert sd["properties"]["method"]["enum"] == ["mtp", "qwen3_next_mtp", "qwen3_5_mtp"]
    assert sd["properties"]["numSpeculativeTokens"]["default"] == 2
    assert props["asyncScheduling"]["nullable"] is True and "default" not in props["asyncScheduling"]
    assert props["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert props["nodeSelector"]["additionalProperties"] == {"type": "string"}
    assert props["gpuMemoryUtilization"]["exclusiveMinimum"] is True
    assert all("description" in props[k] for k in ("model", "image", "tensorParallelSize", "speculativeDecoding"))


def test_names_columns_and_subresources():
    crd = crd_manifest()
    assert crd["metadata"]["name"] == "gdnmodelservers.serving.gdn-operator.io"
    assert crd["spec"]["names"]["shortNames"] == ["gms"]
    v = crd["spec"]["versions"][0]
    assert v["name"] == "v1alpha1" and v["subresources"]["status"] == {}
    cols = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert cols["Ready"] == ".status.ready"
    assert cols["TP"] == ".spec.tensorParallelSize"
    assert cols["Spec-Tokens"] == ".spec.speculativeDecoding.numSpeculativeTokens"
    assert cols["Accept"] == ".status.acceptance.rateDisplay"
    assert cols["Age"] == ".metadata.creationTimestamp"


def test_yaml_round_trips():
    assert yaml.safe_load(crd_yaml()) == crd_manifest()


def test_cel_rules_list_map_conditions_and_scale_selector():
    """Issue 38: the CEL rules come from the pydantic models (api/base.cel), conditions are a map keyed by
    type, and the scale subresource names the pods it counts (tests/integration/test_crd_cel.py: on the API
    server)."""
    v = crd_manifest()["spec"]["versions"][0]
    assert v["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    root = v["schema"]["openAPIV3Schema"]["properties"]
    conditions = root["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert root["status"]["properties"]["selector"]["type"] == "string"
    spec = root["spec"]
    model = spec["properties"]["model"]
    cache = model["properties"]["cache"]
    claim = cache["properties"]["persistentVolumeClaim"]
    rules = {
        "spec": spec,
        "model": model,
        "cache": cache,
        "claim": claim,
        "autoscaling": spec["properties"]["autoscaling"],
    }
    for where, node in rules.items():
        assert node.get("x-kubernetes-validations"), where
        for r in node["x-kubernetes-validations"]:
            assert set(r) == {"rule", "message"} and r["message"], (where, r)
