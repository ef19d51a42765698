"""The mutating webhook's merge patch (opt-in: GDN_MUTATE_SPEC) is the evaluator's mitigation of values the
user SET, recorded in an annotation; unset fields are not patched (they resolve to safe defaults at render)."""

import json

from gdn_operator.handlers.webhook.admission import mitigation_patch
from gdn_operator.handlers.webhook.admission import MITIGATIONS_ANNOTATION

SPEC = {
    "model": {"uri": "hf://Qwen/Qwen3.6-35B-A3B"},
    "image": {"tag": "v0.28.0", "vllmVersion": "0.28.0"},
    "speculativeDecoding": {"numSpeculativeTokens": 3},
}


def test_mitigate_policy_patches_spec_and_annotation():
    assert mitigation_patch({**SPEC, "admissionPolicy": "mitigate"}, "reject") is None  # unset: a safe default
    merge, mitigated = mitigation_patch({**SPEC, "prefixCaching": True, "admissionPolicy": "mitigate"}, "reject")
    assert merge["spec"]["prefixCaching"] is False
    note = json.loads(merge["metadata"]["annotations"][MITIGATIONS_ANNOTATION])
    assert "vllm#43559" in note
    assert {f.rule for f in mitigated} >= {"vllm#43559"}


def test_reject_policy_and_clean_specs_are_not_mutated():
    assert mitigation_patch({**SPEC, "prefixCaching": True, "admissionPolicy": "reject"}, "reject") is None
    assert (
        mitigation_patch({**SPEC, "prefixCaching": False, "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}, "reject") is None
    )
    assert mitigation_patch({"model": "not a mapping"}, "mitigate") is None  # validation explains; mutation stays out


# ------------------------------------------------------------------ issue 29: pod settings, missing APIs ---

import kopf  # noqa: E402
import pytest  # noqa: E402

from gdn_operator.handlers.webhook.admission import admission  # noqa: E402
from runtime_helpers import FakeCrds, make_runtime  # noqa: E402

CLEAN = {
    "model": {"uri": "hf://Qwen/Qwen3.6-35B-A3B"},
    "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"},
    "prefixCaching": False,
}


def admit(spec, rt=None):
    """The webhook's warnings about the cluster (rule findings may warn as well)."""
    warnings: list[str] = []
    admission(spec, warnings, "ml", "srv", None, rt or make_runtime())
    return [w for w in warnings if w.startswith("not runnable")]


def test_gpu_visibility_env_refused_naming_the_opt_in_then_admitted_with_it():
    spec = {**CLEAN, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    with pytest.raises(kopf.AdmissionError) as ei:
        admit(spec)
    assert ei.value.code == 403
    assert "spec.env[0] 'NVIDIA_VISIBLE_DEVICES'" in str(ei.value) and "operator.allowUnsafe" in str(ei.value)
    assert "gpu-visibility-env" in str(ei.value)
    admit(spec, make_runtime(allow_unsafe=("gpu-visibility-env",)))


def test_literal_api_key_and_owned_pod_fields_refused_as_invalid():
    with pytest.raises(kopf.AdmissionError) as ei:
        admit({**CLEAN, "extraArgs": ["--api-key", "sk-secret"]})
    assert ei.value.code == 422 and "set spec.apiKeySecret" in str(ei.value) and "sk-secret" not in str(ei.value)
    with pytest.raises(kopf.AdmissionError) as ei:
        admit({**CLEAN, "pod": {"tolerations": []}})
    assert "spec.pod.tolerations is owned by the operator; set spec.tolerations instead" in str(ei.value)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"nodes": 2, "tensorParallelSize": 2}, "LeaderWorkerSet API (leaderworkersets.leaderworkerset.x-k8s.io)"),
        (
            {"router": {"inferencePool": {"endpointPicker": {"name": "epp"}}}},
            "Gateway API Inference Extension (inferencepools.inference.networking.k8s.io)",
        ),
    ],
)
def test_missing_optional_api_warns_or_refuses_by_policy(extra, needle):
    spec = {**CLEAN, **extra}
    [warning] = admit(spec)
    assert warning.startswith("not runnable on this cluster yet") and needle in warning and "install" in warning
    with pytest.raises(kopf.AdmissionError) as ei:
        admit(spec, make_runtime(missing_api_policy="reject"))
    assert needle in str(ei.value) and "operator.missingApiPolicy" in str(ei.value)
    installed = make_runtime()
    installed.crds = FakeCrds(all=True)  # type: ignore[assignment]
    assert admit(spec, installed) == []


def test_feature_the_chart_disables_is_named_with_its_chart_value():
    [warning] = admit({**CLEAN, "nodes": 2, "tensorParallelSize": 2}, make_runtime(lws=False))
    assert "scaleOut.leaderWorkerSet.enabled=true" in warning


PROBES = {"probes": {"prompts": [{"name": "count", "prompt": "1, 2, 3,", "maxTokens": 8}]}}
KEY = {"apiKeySecret": {"name": "vllm-key", "key": "key"}}


def all_warnings(spec, rt=None) -> list[str]:
    warnings: list[str] = []
    admission(spec, warnings, "ml", "srv", None, rt or make_runtime())
    return warnings


def test_probes_with_an_api_key_the_operator_cannot_read_are_admitted_with_a_warning_naming_the_setting():
    """Issue 38: with the chart default (the operator may not read Secrets) every probe of such a server would get
    HTTP 401; admission says so, naming the chart value, before the first probe round does."""
    [warning] = [w for w in all_warnings({**CLEAN, **PROBES, **KEY}) if "spec.apiKeySecret" in w]
    assert "spec.probes" in warning and "vllm-key/key" in warning and "HTTP 401" in warning
    assert "operator.readApiKeySecrets=true" in warning and "ProbeUnauthorized" in warning
    # each alone, probes turned off, or the operator allowed to read the Secret: nothing to warn about
    for spec, rt in (
        ({**CLEAN, **PROBES}, None),
        ({**CLEAN, **KEY}, None),
        ({**CLEAN, **KEY, "probes": {**PROBES["probes"], "enabled": False}}, None),
        ({**CLEAN, **PROBES, **KEY}, make_runtime(read_api_key_secrets=True)),
    ):
        assert not [w for w in all_warnings(spec, rt) if "apiKeySecret" in w], spec


# ------------------------------------------------------- issue 37: admission on the event loop, not in a thread ---

import threading  # noqa: E402

from gdn_operator.handlers import main  # noqa: E402
from gdn_operator.handlers.core.plan import may_read_api  # noqa: E402
from gdn_operator.handlers.runtime import MEMO_KEY  # noqa: E402


class CountingCrds(FakeCrds):
    """Every CRD served; counts the lookups (on a real cluster each may be a blocking API read)."""

    def __init__(self) -> None:
        super().__init__(all=True)
        self.asked: list[str] = []
        self.threads: set[str] = set()

    def exists(self, name: str) -> bool:
        self.asked.append(name)
        self.threads.add(threading.current_thread().name)
        return super().exists(name)


@pytest.mark.parametrize(
    "spec",
    [
        CLEAN,
        {**CLEAN, "nodes": 1},
        {**CLEAN, "nodes": 2, "tensorParallelSize": 2},
        {**CLEAN, "router": {"inferencePool": {}}},
        {**CLEAN, "router": {}},
        {**CLEAN, "nodes": "2"},  # invalid: refused before any lookup, still sent to a thread (conservative)
        {"model": "not a mapping"},
    ],
)
def test_only_specs_marked_may_read_api_ever_look_a_crd_up(spec):
    """main.validate runs admission on kopf's event loop unless may_read_api: a spec it lets through there must
    never reach the CRD cache (a blocking read), whatever the settings enable."""
    rt = make_runtime(lws=True, inference_pool=True)
    rt.crds = CountingCrds()  # type: ignore[assignment]
    try:
        admission(spec, [], "ml", "srv", None, rt)
    except kopf.AdmissionError:
        pass
    assert not rt.crds.asked or may_read_api(spec)


def test_multi_node_and_inference_pool_specs_are_marked():
    assert may_read_api({**CLEAN, "nodes": 2}) and may_read_api({**CLEAN, "router": {"inferencePool": {"x": 1}}})
    assert not may_read_api(CLEAN) and not may_read_api({**CLEAN, "nodes": 1}) and not may_read_api({**CLEAN, "router": {}})


async def test_validate_answers_as_admission_does_on_either_path():
    rt = make_runtime(lws=True)
    rt.crds = CountingCrds()  # type: ignore[assignment]
    memo = kopf.Memo()
    memo[MEMO_KEY] = rt
    warnings: list[str] = []
    await main.validate(kopf.Spec(kopf.Body({"spec": CLEAN})), warnings, "ml", memo, name="srv")
    assert rt.crds.asked == []
    multi = {**CLEAN, "nodes": 2, "tensorParallelSize": 2}
    await main.validate(kopf.Body({"spec": multi}).spec, warnings, "ml", memo, name="srv")
    assert rt.crds.asked == ["leaderworkersets.leaderworkerset.x-k8s.io"]
    assert threading.current_thread().name not in rt.crds.threads  # ... in a thread, not on the event loop
    with pytest.raises(kopf.AdmissionError):
        await main.validate(kopf.Body({"spec": {**CLEAN, "prefixCaching": True}}).spec, [], "ml", memo, name="srv")
