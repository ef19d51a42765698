"""Issue 38 item 3 in the API: spec.model.revision, spec.model.cache.include, the created claim's retainPolicy,
and oci:// refused until something loads it — each bad value refused naming the field and the fix."""

import pytest

from gdn_operator.api.load import ManifestError, parse_spec

from builders import GMS, MODEL

V32 = GMS().version("0.32.0")


def refused(model) -> str:
    with pytest.raises(ManifestError) as ei:
        parse_spec(V32.update(model=model).spec())
    return " ".join(ei.value.problems)


def test_revision_include_and_retain_policy_parse():
    s = parse_spec(
        V32.update(
            model={
                "uri": MODEL,
                "revision": "0123456789abcdef0123456789abcdef01234567",
                "cache": {
                    "include": ["*.json", "*.safetensors"],
                    "persistentVolumeClaim": {"size": "1Ti", "retainPolicy": "Delete"},
                },
            }
        ).spec()
    )
    assert s.model.revision.startswith("01234")
    assert s.model.cache.include_patterns == ("*.json", "*.safetensors")
    assert s.model.cache.persistent_volume_claim.retain_policy == "Delete"
    unset = parse_spec(V32.update(model={"uri": MODEL, "cache": {"persistentVolumeClaim": {"size": "1Ti"}}}).spec())
    assert unset.model.revision is None and unset.model.cache.persistent_volume_claim.retain_policy is None


def test_oci_models_refused_naming_what_to_use_instead():
    msg = refused({"uri": "oci://registry.example/models/qwen:1"})
    assert "model.uri" in msg and "oci://" in msg and "hf://" in msg and "pvc://" in msg, msg


@pytest.mark.parametrize(
    ("model", "text"),
    [
        ({"uri": MODEL, "revision": "main branch"}, "is not a Hub revision"),
        ({"uri": MODEL, "revision": "../../etc"}, "is not a Hub revision"),
        ({"uri": "pvc://weights/q", "revision": "main"}, "revision applies to hf:// models"),
        ({"uri": MODEL, "cache": {"include": []}}, 'use ["*"]'),
        ({"uri": MODEL, "cache": {"include": ["$(rm -rf /)"]}}, "is not a file glob"),
        ({"uri": MODEL, "cache": {"persistentVolumeClaim": {"claimName": "c", "retainPolicy": "Delete"}}}, "never deleted"),
        ({"uri": MODEL, "cache": {"persistentVolumeClaim": {"size": "1Ti", "retainPolicy": "Keep"}}}, "retainPolicy"),
    ],
)
def test_bad_delivery_settings_name_the_field(model, text):
    msg = refused(model)
    assert text in msg, msg
