"""spec.probes: defaults, bounds and errors that name the field and the fix; the CRD carries the fields."""

import pytest

from gdn_operator.api.crd import crd_manifest
from gdn_operator.api.load import ManifestError, parse_spec

from builders import GMS


def problems(probes) -> str:
    with pytest.raises(ManifestError) as e:
        parse_spec(GMS().set("probes", probes).spec())
    return "\n".join(e.value.problems)


def test_off_by_default_and_defaults_when_set():
    assert parse_spec(GMS().spec()).probes is None
    p = parse_spec(GMS().set("probes", {"prompts": [{"name": "capital", "prompt": "The capital of France is"}]}).spec()).probes
    assert (p.enabled, p.interval_seconds, p.timeout_seconds, p.failure_threshold) == (True, 60, 10, 3)
    q = p.prompts[0]
    assert q.learns and q.max_tokens == 16 and q.comparison == ("prefix", 8)


def test_default_mode_for_a_given_expectation_is_exact_and_learn_prefix_is_capped():
    p = parse_spec(
        GMS()
        .set(
            "probes",
            {
                "prompts": [
                    {"name": "a", "promptTokenIds": [1, 2], "expectedTokenIds": [3, 4], "maxTokens": 2},
                    {"name": "b", "prompt": "x", "maxTokens": 4},
                    {"name": "c", "prompt": "x", "mode": "minLength:3", "maxTokens": 4},
                ]
            },
        )
        .spec()
    ).probes
    assert [q.comparison for q in p.prompts] == [("exact", None), ("prefix", 4), ("minLength", 3)]
    assert not p.prompts[0].learns and p.prompts[1].learns


@pytest.mark.parametrize(
    "probes, needle",
    [
        ({"prompts": []}, "prompts"),
        ({"prompts": [{"name": "a"}]}, "set exactly one of prompt and promptTokenIds"),
        ({"prompts": [{"name": "a", "prompt": "x", "promptTokenIds": [1]}]}, "set exactly one of prompt and promptTokenIds"),
        ({"prompts": [{"name": "A b", "prompt": "x"}]}, "lowercase letters"),
        ({"prompts": [{"name": "a", "prompt": "x"}, {"name": "a", "prompt": "y"}]}, "repeated: a"),
        ({"prompts": [{"name": "a", "prompt": "x", "mode": "fuzzy"}]}, "exact, prefix, prefix:N or minLength:N"),
        ({"prompts": [{"name": "a", "prompt": "x", "mode": "prefix:20"}]}, "maxTokens is 16"),
        ({"prompts": [{"name": "a", "prompt": "x", "expected": " Paris", "mode": "prefix:2"}]}, "give expectedTokenIds"),
        ({"prompts": [{"name": "a", "prompt": "x", "expected": "y", "expectedTokenIds": [1]}]}, "not both"),
        ({"prompts": [{"name": "a", "prompt": "x", "expectedTokenIds": [1, 2, 3], "maxTokens": 2}]}, "raise maxTokens"),
        ({"prompts": [{"name": "a", "prompt": "x", "maxTokens": 1000}]}, "maxTokens"),
        ({"prompts": [{"name": "a", "prompt": "x" * 3000}]}, "prompt"),
        ({"prompts": [{"name": "a", "promptTokenIds": [-1]}]}, "promptTokenIds"),
        ({"prompts": [{"name": f"p{i}", "prompt": "x"} for i in range(9)]}, "prompts"),
        (
            {"intervalSeconds": 10, "timeoutSeconds": 10, "prompts": [{"name": "a", "prompt": "x"}]},
            "must be below intervalSeconds",
        ),
        ({"intervalSeconds": 1, "prompts": [{"name": "a", "prompt": "x"}]}, "intervalSeconds"),
        ({"failureThreshold": 0, "prompts": [{"name": "a", "prompt": "x"}]}, "failureThreshold"),
        ({"prompts": [{"name": "a", "prompt": "x", "temperature": 1}]}, "temperature"),
    ],
)
def test_bad_probes_name_the_field_and_the_fix(probes, needle):
    text = problems(probes)
    assert "probes" in text and needle in text, text


def test_crd_carries_probe_fields_with_descriptions_and_bounds():
    props = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    p = props["spec"]["properties"]["probes"]
    assert p["description"] and p["properties"]["intervalSeconds"]["minimum"] == 5
    item = p["properties"]["prompts"]["items"]
    assert p["properties"]["prompts"]["maxItems"] == 8
    assert item["properties"]["maxTokens"]["maximum"] == 128
    assert item["properties"]["expected"]["default"] == "learn"
    assert item["properties"]["mode"]["pattern"].startswith("^(exact|prefix")
    assert all(item["properties"][k].get("description") for k in ("prompt", "promptTokenIds", "expected", "mode", "maxTokens"))
    s = props["status"]["properties"]["probes"]["properties"]
    assert {"state", "generation", "reference", "results", "diagnosis"} <= set(s)
    assert {"position", "expected", "got"} <= set(s["results"]["items"]["properties"]["lastFailure"]["properties"])
