"""GDNGuard API (issue 35): the committed CRD is what `gdnctl crd --kind GDNGuard` generates, unset means
safe, and bad input names the field and the fix."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gdn_operator.api.crd import GUARD_CRD_RELATIVE_PATH, guard_crd_manifest, guard_crd_yaml
from gdn_operator.api.guard import GDNGuard, GDNGuardSpec
from gdn_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_committed_guard_crd_matches_generated():
    committed = (ROOT / GUARD_CRD_RELATIVE_PATH).read_text()
    assert committed == guard_crd_yaml(), f"run `gdnctl crd --kind GDNGuard > {GUARD_CRD_RELATIVE_PATH}` and commit it"


def test_gdnctl_crd_kind_guard_prints_it(capsys):
    assert main(["crd", "--kind", "GDNGuard"]) == 0
    assert capsys.readouterr().out == guard_crd_yaml()


def test_guard_crd_names_and_structure():
    crd = guard_crd_manifest()
    assert crd["metadata"]["name"] == "gdnguards.serving.gdn-operator.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("GDNGuard", "gdnguards", ["gdng"])
    assert crd["spec"]["scope"] == "Namespaced"
    (v,) = crd["spec"]["versions"]
    assert v["subresources"] == {"status": {}}
    spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["selector"]
    assert spec["properties"]["admission"]["properties"]["policy"]["enum"] == ["warn", "deny"]
    assert spec["properties"]["remediation"]["default"] == "none"
    assert yaml.safe_load(guard_crd_yaml()) == crd


def test_unset_means_safe():
    spec = GDNGuardSpec.model_validate({"selector": {"matchLabels": {"app": "my-vllm"}}})
    assert spec.admission.policy == "warn" and spec.remediation == "none"
    f = spec.features
    assert (f.admission, f.crash_watch, f.stall, f.acceptance, f.probes) == (True, True, True, True, False)
    assert spec.vllm_version.source == "imageTag" and spec.vllm_version.image_tag is not None


def test_round_trip_of_the_documented_manifest():
    doc = {
        "apiVersion": "serving.gdn-operator.io/v1alpha1",
        "kind": "GDNGuard",
        "metadata": {"name": "g", "namespace": "team"},
        "spec": {
            "selector": {"matchLabels": {"app": "my-vllm"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            "container": "vllm",
            "vllmVersion": {"pinned": "0.33.0"},
            "admission": {"policy": "deny"},
        },
    }
    g = GDNGuard.model_validate(doc)
    assert g.spec.vllm_version.source == "pinned"
    assert g.spec.dump()["selector"]["matchExpressions"] == [{"key": "tier", "operator": "Exists", "values": []}]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"selector": {}}, "spec.selector selects by nothing"),
        (
            {"selector": {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}},
            "spec.selector selects by nothing (empty, or only NotIn / DoesNotExist)",
        ),
        ({"selector": {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}}, "spec.selector selects by nothing"),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"imageTag": {"pattern": r"^(v)?\1([0-9.]+)"}}},
            "spec.vllmVersion.imageTag.pattern '^(v)?\\\\1([0-9.]+)' is not an RE2 regular expression",
        ),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"imageTag": {"pattern": r"(?=v)([0-9.]+)"}}},
            "no backreferences or lookaround",
        ),
        ({"selector": {"matchLabels": {"app": "bad value!"}}}, "spec.selector.matchLabels"),
        (
            {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.selector.matchExpressions[0].values: must be non-empty",
        ),
        ({"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"pinned": "0.3.0", "annotation": "x/y"}}, "set exactly one"),
        ({"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"pinned": "latest"}}, "write it as X.Y.Z"),
        ({"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"imageTag": {"pattern": "v(1)(2)"}}}, "exactly one"),
        ({"selector": {"matchLabels": {"a": "b"}}, "container": "Not_A_Name"}, "spec.container"),
        ({"selector": {"matchLabels": {"a": "b"}}, "features": {"probes": True}}, "spec.probes.prompts"),
        ({"selector": {"matchLabels": {"a": "b"}}, "admission": {"policy": "reject"}}, "'warn' or 'deny'"),
        ({"selector": {"matchLabels": {"a": "b"}}, "remediation": "restart"}, "'none' or 'deletePod'"),
    ],
)
def test_bad_input_names_the_field_and_the_fix(spec, says):
    with pytest.raises(ValidationError) as e:
        GDNGuardSpec.model_validate(spec)
    assert says in str(e.value)


def test_a_catastrophic_pattern_is_matched_in_time_linear_in_the_tag():
    """Issue 48: `^(?:a+)+(b)` took 10 s on a 30-character tag with Python's backtracking `re` (x4 per two
    characters more), in the operator's process. RE2 answers at once, however long the tag (an OCI tag has at most
    128 characters; longer input is cut there)."""
    import time

    spec = GDNGuardSpec.model_validate(
        {"selector": {"matchLabels": {"a": "b"}}, "vllmVersion": {"imageTag": {"pattern": "^(?:a+)+(b)"}}}
    )
    for n in (27, 128, 100_000):
        t0 = time.perf_counter()
        assert spec.vllm_version.resolve("a" * n, {}) == (None, "imageTag")
        assert time.perf_counter() - t0 < 0.05, n
    assert spec.vllm_version.resolve("aaab", {}) == ("b", "imageTag")


def test_the_crd_refuses_what_re2_refuses_and_empty_selectors_of_only_negations():
    """The CRD carries the same checks as CEL rules, so the API server refuses them at admission of the guard
    (tests/integration/test_guard_hostile.py sends them through the real API server)."""
    crd = guard_crd_manifest()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    tag = spec["vllmVersion"]["properties"]["imageTag"]
    assert any("matches(self.pattern)" in r["rule"] for r in tag["x-kubernetes-validations"])
    sel = spec["selector"]
    assert any("e.operator == 'In' || e.operator == 'Exists'" in r["rule"] for r in sel["x-kubernetes-validations"])
    assert sel["properties"]["matchExpressions"]["items"]["properties"]["values"]["maxItems"] == 16
