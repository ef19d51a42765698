"""Admitted-but-undeployable specs are refused at admission (issue 11, parts 3 and 4).

Each case below was admitted before, then failed at apply (server-side apply 500/422, retried as
transient). The integration twin is tests/integration/test_hostile_input.py.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from gdn_operator.api import k8s
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.handlers.webhook import limits as webhook_limits
from gdn_operator.handlers.server.reconcile import refused_as_invalid
from gdn_operator.render.meta import RenderError, check_names

from builders import GMS

BASE = GMS().version("0.32.0").spec()
NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]
        }
    }
}


def refused(patch) -> str:
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, **patch})
    return str(e.value)


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({"affinity": {"x": 1}}, "spec.affinity: affinity.x: unknown field (Kubernetes Affinity)"),
        ({"affinity": {"node_affinity": {}}}, "affinity.node_affinity: not a Kubernetes field name"),
        (
            {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}},
            "topologyKey: Field required",
        ),
        (
            {"tolerations": [{"key": "a", "tolerationSeconds": "10"}]},
            "tolerations[0].tolerationSeconds: Input should be a valid integer",
        ),
        ({"tolerations": [{"key": "a", "bogus": 1}]}, "tolerations[0].bogus: unknown field"),
        # semantic rules of the API server's pod validation
        ({"tolerations": [{"key": "a", "tolerationSeconds": 10}]}, "must be NoExecute when tolerationSeconds is set"),
        ({"tolerations": [{"value": "x"}]}, "tolerations[0].operator: must be Exists when key is empty"),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
            "nodeSelectorTerms: must be non-empty",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Bogus", "values": ["b"]}]}]
                        }
                    }
                }
            },
            "operator: 'Bogus' is not one of",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]
                        }
                    }
                }
            },
            "values: must be non-empty with operator In",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 0, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                        ]
                    }
                }
            },
            "weight: must be 1..100",
        ),
        ({"resources": {"cpu": "16\n"}}, "spec.resources.cpu: '16\\n' is not a Kubernetes quantity"),
        ({"resources": {"memory": "0"}}, "spec.resources.memory"),
        ({"resources": {"shmSize": "-1Gi"}}, "spec.resources.shmSize"),
        ({"image": {"tag": "v0.28.0", "vllmVersion": "0.28.0\n"}}, "spec.image.vllmVersion: '0.28.0\\n' is not a version string"),
        ({"image": {"tag": "v1\n", "vllmVersion": "0.28.0"}}, "spec.image.tag"),
        ({"image": {"tag": "v1", "vllmVersion": "0.28.0", "repository": "Bad Repo"}}, "spec.image.repository"),
        ({"model": {"uri": "hf://Qwen/Qwen3.5-27B\n"}}, "spec.model.uri"),
        ({"model": {"uri": "pvc://Claim/x"}}, "claim name"),
        ({"model": {"uri": "hf://x/y", "hfTokenSecret": {"name": "Bad_Name"}}}, "spec.model.hfTokenSecret.name"),
        ({"env": [{"name": "FOO\n", "value": "x"}]}, "spec.env[0].name"),
        ({"nodeSelector": {"a\n": "b"}}, "spec.nodeSelector"),
        ({"nodeSelector": {"a": "b\n"}}, "spec.nodeSelector"),
        ({"resources": {"gpuType": "H100\n"}}, "spec.resources.gpuType"),
    ],
)
def test_undeployable_values_refused_with_field_path(patch, expected):
    assert expected in refused(patch)


def test_real_kubernetes_shapes_admitted():
    spec = parse_spec(
        {
            **BASE,
            "affinity": NODE_AFFINITY,
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            ],
            "resources": {"cpu": "1.5", "memory": "64Gi", "shmSize": "1e9"},
        }
    )
    assert spec.affinity == NODE_AFFINITY and spec.resources.shm_size == "1e9"


@pytest.mark.parametrize("name", ["1abc", "a.b", "a" * 64, "Abc", "abc-"])
def test_names_that_cannot_name_a_service_are_refused(name):
    with pytest.raises(RenderError, match="DNS-1035"):
        check_names(name)


@pytest.mark.parametrize(
    "value, ok",
    [
        ("8", True),
        ("500m", True),
        ("1.5Gi", True),
        ("1e3", True),
        ("16\n", False),
        ("0", False),
        ("-1", False),
        ("1Gb", False),
        ("", False),
        (".5", True),
    ],
)
def test_quantity_grammar(value, ok):
    assert k8s.positive_quantity(value) is ok


#: strings of resource.Quantity's grammar: <signed number><one suffix> (binary SI, decimal SI or an exponent)
_QUANTITIES = st.builds(
    lambda sign, whole, frac, suffix: sign + (whole + frac if (whole + frac).strip(".") else "0") + suffix,
    st.sampled_from(["", "+", "-"]),
    st.sampled_from(["", "0", "1", "8", "64", "1024", "007"]),
    st.sampled_from(["", ".", ".5", ".25", ".000"]),
    st.sampled_from(
        ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E", "e3", "E3", "e-2", "e+1", "e0"]
    ),
)


@settings(deadline=None)  # timing belongs in bench/: a loaded machine's first example can take 500 ms
@given(_QUANTITIES)
def test_quantity_check_equals_the_clients_parse_quantity(value):
    """api/ may not import the Kubernetes client (gdnctl runs without it; the import-linter contract), so
    admission keeps its own pure check of resource.Quantity's grammar. On that grammar it decides exactly
    what kubernetes.utils.parse_quantity (which handlers/server/workload.py uses) decides."""
    assert k8s.positive_quantity(value) == (parse_quantity(value) > 0), value


@settings(deadline=None)  # timing belongs in bench/: a loaded machine's first example can take 500 ms
@given(st.text(alphabet="0123456789.+-eEKMGTPinumk _\n", max_size=8))
def test_quantity_check_accepts_nothing_the_client_cannot_parse(value):
    """Outside the grammar the check is the stricter one: parse_quantity takes what Decimal takes (`16\\n`,
    ` 8`, `1_0`, `1e-3n`), which the API server refuses; the check never accepts what the client refuses."""
    if k8s.positive_quantity(value):
        assert parse_quantity(value) > 0, value


# ------------------------------------------------------------------------------- bounds (part 4) ---


def _deep(levels: int) -> dict:
    root: dict = {}
    cur = root
    for _ in range(levels):
        cur["x"] = [{}]
        cur = cur["x"][0]
    return root


def test_deep_nesting_is_a_field_error_not_a_recursion_error():
    msg = refused({"affinity": _deep(3000)})
    assert "spec.affinity nests deeper than 32 levels" in msg


def test_oversized_spec_names_the_largest_field():
    msg = refused({"env": [{"name": f"V{i}", "value": "x" * 30000} for i in range(30)]})
    assert "more than the 512 KiB limit" in msg and "the largest field is spec.env" in msg


def test_webhook_precheck_answers_a_422_review_for_undecodable_nesting():
    deep = '{"x":[' * 1500 + "1" + "]}" * 1500
    text = (
        '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","object":'
        '{"spec":{"affinity":' + deep + "}}}}"
    )
    review, deny = webhook_limits.precheck(text)
    assert review is None
    body = json.loads(deny.text)
    assert body["response"]["uid"] == "u-1" and body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 422
    assert body["response"]["status"]["message"].startswith("spec.affinity: nested deeper than 64 levels")


def test_webhook_precheck_passes_ordinary_reviews():
    review, deny = webhook_limits.precheck(json.dumps({"request": {"uid": "u", "object": {"spec": BASE}}}))
    assert deny is None and review["request"]["uid"] == "u"


# -------------------------------------------------------------------- apply refusals (part 3) ---


def _api_error(status: int, body: dict) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps(body)
    return e


@pytest.mark.parametrize(
    "status, body, permanent",
    [
        (
            500,
            {
                "reason": "InternalError",
                "message": "failed to create typed patch object (ns/x; apps/v1, Kind=Deployment): "
                ".spec.template.spec.affinity.x: field not declared in schema",
            },
            True,
        ),
        (422, {"reason": "Invalid", "message": 'Deployment.apps "x" is invalid'}, True),
        (400, {"reason": "BadRequest"}, True),
        (500, {"reason": "InternalError", "message": "etcdserver: request timed out"}, False),
        (503, {"reason": "ServiceUnavailable"}, False),
        (429, {"reason": "TooManyRequests"}, False),
    ],
)
def test_apply_refusal_classification(status, body, permanent):
    assert refused_as_invalid(_api_error(status, body)) is permanent
