"""GDNModelServer models: defaults, validation errors with field paths."""

import pytest

from gdn_operator.api.load import ManifestError, load_documents, parse_object, parse_spec
from gdn_operator.api.spec import GDNModelServerSpec

from builders import GMS


def test_defaults():
    s = parse_spec(GMS().spec())
    assert s.replicas == 1
    assert s.tensor_parallel_size == 1
    assert s.speculative_decoding.enabled is True
    assert s.speculative_decoding.method == "mtp"
    assert s.speculative_decoding.num_speculative_tokens == 2
    assert s.async_scheduling is None and s.prefix_caching is None  # None = vLLM's own default
    assert s.model_runner == "auto"
    # issue 46: unset = vLLM's choice (the renderer decides per release: render/engine.py gpu_memory_utilization)
    assert s.gpu_memory_utilization is None and s.cudagraph_implementation is None
    assert s.startup_budget_seconds >= 1800
    assert s.remediation.mode == "auto" and s.remediation.threshold == 3
    assert s.metrics.scrape_interval_seconds == 15
    assert s.image.repository == "vllm/vllm-openai"
    assert s.image.reference == "vllm/vllm-openai:v0.33.0"


def test_dump_is_camel_case_and_round_trips():
    s = parse_spec(GMS().update(tensorParallelSize=4, speculativeDecoding={"numSpeculativeTokens": 3}).spec())
    d = s.dump()
    assert d["tensorParallelSize"] == 4
    assert d["speculativeDecoding"]["numSpeculativeTokens"] == 3
    assert "tensor_parallel_size" not in d
    assert GDNModelServerSpec.model_validate(d) == s


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({"tensorParallelSize": 0}, "spec.tensorParallelSize: Input should be greater than or equal to 1 (got 0)"),
        ({"tensorParallelSize": "two"}, "spec.tensorParallelSize: Input should be a valid integer"),
        ({"replicas": -1}, "spec.replicas: Input should be greater than or equal to 0"),
        ({"gpuMemoryUtilization": 1.5}, "spec.gpuMemoryUtilization: Input should be less than or equal to 0.99"),
        ({"speculativeDecoding": {"numSpeculativeTokens": 99}}, "spec.speculativeDecoding.numSpeculativeTokens"),
        (
            {"speculativeDecoding": {"method": "eagle"}},
            "spec.speculativeDecoding.method: Input should be 'mtp', 'qwen3_next_mtp' or 'qwen3_5_mtp'",
        ),
        ({"tensorParalelSize": 2}, "spec.tensorParalelSize: unknown field"),
        ({"modelRunner": "v3"}, "spec.modelRunner: Input should be 'auto', 'v1' or 'v2'"),
        (
            {"extraArgs": ["--tensor-parallel-size=4"]},
            "extraArgs[0] '--tensor-parallel-size' sets --tensor-parallel-size, which the operator owns; set spec.tensorParallelSize instead",
        ),
        ({"extraArgs": ["--trust-remote-code", "--no-async-scheduling"]}, "set spec.asyncScheduling instead"),
        ({"env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}]}, "set spec.modelRunner instead"),
        # issue 46: the breakable-CUDA-graph switch is the operator's (spec.cudagraphImplementation)
        ({"env": [{"name": "VLLM_USE_BREAKABLE_CUDAGRAPH", "value": "0"}]}, "set spec.cudagraphImplementation instead"),
        ({"cudagraphImplementation": "piecewise"}, "spec.cudagraphImplementation: Input should be 'breakable' or 'compiled'"),
        ({"cudagraphImplementation": "breakable", "enforceEager": True}, "drop cudagraphImplementation or enforceEager"),
        # vLLM's parser spellings that would smuggle an owned option past the rules
        ({"extraArgs": ["--speculative-config.num_speculative_tokens=5"]}, "sets --speculative-config, which the operator owns"),
        ({"extraArgs": ["--speculative_config={}"]}, "sets --speculative-config"),
        ({"extraArgs": ["--async-sched"]}, "sets --async-scheduling"),
        ({"extraArgs": ["--max_model_len=9"]}, "set spec.maxModelLen instead"),
        ({"extraArgs": ["--config", "/x.yaml"]}, "'--config' would set vLLM options the known-crash rules cannot see"),
        ({"extraArgs": ["-O3"]}, "'-O3' would set vLLM options"),
        ({"resources": {"gpuType": "NVIDIA H100 80GB HBM3"}}, "is not a valid label value"),
        ({"nodeSelector": {"pool": "gpu nodes"}}, "is not a valid label value"),
        ({"tolerations": [{"key": "x", "operator": "Bogus"}]}, "tolerations[0].operator 'Bogus' must be Equal or Exists"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env[1] 'A' is set twice"),
        ({"model": {"uri": "Qwen/Qwen3.5"}}, "spec.model.uri: must look like hf://ORG/NAME"),
        ({"model": {"uri": "pvc://Bad_Claim/models"}}, "is not a valid Kubernetes name"),
        ({"resources": {"memory": "lots"}}, "spec.resources.memory: 'lots' is not a Kubernetes quantity"),
        ({"cudagraphMode": "FULL", "enforceEager": True}, "enforceEager: true disables CUDA graphs"),
    ],
)
def test_validation_errors_name_the_field(patch, expected):
    spec = GMS().update(**patch).spec()
    with pytest.raises(ManifestError) as ei:
        parse_spec(spec)
    text = "\n".join(ei.value.problems)
    assert expected in text, text


def test_ordinary_extra_args_pass():
    s = parse_spec(GMS().update(extraArgs=["--trust-remote-code", "--max-logprobs=5", "--seed", "1"]).spec())
    assert s.extra_args == ["--trust-remote-code", "--max-logprobs=5", "--seed", "1"]


def test_missing_required_fields_each_reported():
    with pytest.raises(ManifestError) as ei:
        parse_spec({"image": {"tag": "x"}})
    problems = ei.value.problems
    assert "spec.model: required field is missing" in problems
    assert "spec.image.vllmVersion: required field is missing" in problems


def test_wrong_kind_rejected():
    with pytest.raises(ManifestError, match="expected serving.gdn-operator.io/v1alpha1 GDNModelServer, got apps/v1 Deployment"):
        parse_object({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}})


def test_malformed_yaml_names_line():
    with pytest.raises(ManifestError, match=r"f.yaml:2:\d+: malformed YAML"):
        load_documents("a: b\n  c: : d\n", "f.yaml")


def test_pvc_uri_parts():
    s = parse_spec(GMS().update(model={"uri": "pvc://model-cache/qwen/Qwen3.5-27B"}).spec())
    assert s.model.pvc_claim == "model-cache"
    assert s.model.pvc_subpath == "qwen/Qwen3.5-27B"


def test_status_tolerates_unknown_fields():
    from gdn_operator.api.status import GDNModelServerStatus

    st = GDNModelServerStatus.model_validate({"phase": "Ready", "futureField": 1})
    assert st.phase == "Ready"


def test_full_object_parses():
    gms = parse_object(GMS("x", namespace=None).obj())
    assert gms.metadata.name == "x"
    assert gms.spec.image.vllm_version == "0.33.0"
