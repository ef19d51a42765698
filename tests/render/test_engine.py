"""Rendering spec → vLLM argv and Kubernetes objects (pure functions)."""

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gdn_operator.api import flags
from gdn_operator.api.load import parse_spec
from gdn_operator.render.engine import (
    GPU_MEMORY_BEFORE_KV_SIZING,
    deployment,
    engine_env,
    gpu_memory_utilization,
    service,
    vllm_args,
)
from gdn_operator.render.meta import RenderError, safe_label_value
from gdn_operator.render.objects import render_all
from gdn_operator.rules.launchline import parse_launch_line

from builders import GMS


def flag_value(args, flag):
    return args[args.index(flag) + 1]


def test_argv_core_flags():
    args = vllm_args(
        "srv",
        parse_spec(GMS().update(tensorParallelSize=2, maxModelLen=32768, speculativeDecoding={"numSpeculativeTokens": 3}).spec()),
    )
    assert args[0] == "Qwen/Qwen3.5-27B"
    assert flag_value(args, "--served-model-name") == "srv"
    assert flag_value(args, "--tensor-parallel-size") == "2"
    assert flag_value(args, "--max-model-len") == "32768"
    assert json.loads(flag_value(args, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert flag_value(args, "--port") == "8000"


def test_argv_leaves_vllm_defaults_alone_when_unset():
    args = vllm_args("srv", parse_spec(GMS().spec()))
    for f in (
        "--async-scheduling",
        "--no-async-scheduling",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--attention-backend",
        "--gdn-prefill-backend",
        "--compilation-config",
        "--enforce-eager",
        "--max-model-len",
    ):
        assert f not in args


def test_argv_explicit_toggles_and_backends():
    args = vllm_args(
        "srv",
        parse_spec(
            GMS()
            .update(
                asyncScheduling=False,
                prefixCaching=False,
                chunkedPrefill=True,
                attentionBackend="FLASHINFER",
                gdnPrefillBackend="triton",
                cudagraphMode="FULL_AND_PIECEWISE",
                maxNumSeqs=64,
                maxNumBatchedTokens=8192,
                extraArgs=["--trust-remote-code"],
            )
            .spec()
        ),
    )
    assert "--no-async-scheduling" in args and "--no-enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert flag_value(args, "--attention-backend") == "FLASHINFER"
    assert flag_value(args, "--gdn-prefill-backend") == "triton"
    assert json.loads(flag_value(args, "--compilation-config")) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert flag_value(args, "--max-num-seqs") == "64"
    assert args[-1] == "--trust-remote-code"


_FLAG_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "tensorParallelSize": st.sampled_from([1, 2, 4]),
        "gpuMemoryUtilization": st.sampled_from([0.5, 0.85, 0.9, 0.95, 0.123]),
        "maxModelLen": st.sampled_from([4096, 32768, 262144]),
        "maxNumSeqs": st.integers(1, 512),
        "maxNumBatchedTokens": st.sampled_from([2048, 8192]),
        "asyncScheduling": st.booleans(),
        "prefixCaching": st.booleans(),
        "chunkedPrefill": st.booleans(),
        "attentionBackend": st.sampled_from(["FLASH_ATTN", "FLASHINFER"]),
        "gdnPrefillBackend": st.sampled_from(["flashinfer", "triton"]),
        "cudagraphMode": st.sampled_from(["PIECEWISE", "FULL_AND_PIECEWISE"]),
        "enforceEager": st.booleans(),
        "speculativeDecoding": st.sampled_from([{"enabled": False}, {"numSpeculativeTokens": 1}, {"numSpeculativeTokens": 4}]),
    },
)


@settings(deadline=None)  # timing belongs in bench/: a loaded machine's first example can take 500 ms
@given(_FLAG_FIELDS)
def test_rendered_argv_reads_back_to_the_same_settings(fields):
    """One flag table (api/flags.py, issue 22 item 4): what the renderer writes, the launch-line reader reads
    back as the same spec values — every field of the reader's table, the MTP settings and the CUDA-graph mode."""
    assume(not (fields.get("enforceEager") and "cudagraphMode" in fields))  # refused by the spec's validator
    rendered = parse_spec(GMS().update(**fields).spec())
    argv = vllm_args("srv", rendered)
    options = [a for a in argv if a.startswith("-")]
    written = {
        sp for f in (*flags.READ_FLAGS, flags.PIPELINE_PARALLEL, flags.SERVED_NAME, flags.SHUTDOWN_TIMEOUT) for sp in f.spellings
    } | {flags.HOST, flags.PORT, flags.SPECULATIVE_CONFIG, flags.COMPILATION_CONFIG}
    assert set(options) <= written, set(options) - written  # every option the renderer writes is in the table
    back = parse_launch_line(["vllm", "serve", *argv], vllm_version="0.33.0").spec.model_dump(by_alias=True)
    want = rendered.model_dump(by_alias=True)
    # unset before vLLM 0.34.0 renders the fraction always rendered there (issue 46): that is what runs
    want["gpuMemoryUtilization"] = gpu_memory_utilization(rendered)
    for key in [f.key for f in flags.READ_FLAGS] + ["speculativeDecoding", "cudagraphMode"]:
        assert back[key] == want[key], key


#: one valid value per spec key of flags.JSON_FLAGS (a new entry there fails the test below until it has one)
_JSON_VALUES: dict[str, object] = {
    "speculativeDecoding.method": "mtp",
    "speculativeDecoding.numSpeculativeTokens": 3,
    "cudagraphMode": "PIECEWISE",
    "gdnPrefillBackend": "triton",
    "model.architecture": ["Qwen3_5ForCausalLM"],
}


@pytest.mark.parametrize("flag", sorted(flags.JSON_FLAGS))
def test_every_json_key_of_the_table_reads_back_to_its_spec_key(flag):
    """JSON_FLAGS is the one home of the JSON keys: a JSON option written under the table's keys (json_args)
    reads back onto the spec keys the table names — also for the options only the reader sees
    (--additional-config, --hf-overrides)."""
    keys = flags.JSON_FLAGS[flag]
    argv = ["vllm", "serve", "Qwen/Qwen3.5-27B", *flags.json_args(flag, {k: _JSON_VALUES[k] for k in keys})]
    if flag != flags.SPECULATIVE_CONFIG:
        argv += flags.json_args(flags.SPECULATIVE_CONFIG, {"speculativeDecoding.method": "mtp"})
    line = parse_launch_line(argv, vllm_version="0.33.0")
    back = line.spec.model_dump(by_alias=True)
    for key in keys:
        got: object = back
        for part in key.split("."):
            assert isinstance(got, dict), (key, got)
            got = got[part]
        want = _JSON_VALUES[key]
        assert got == (want[0] if isinstance(want, list) else want), key
    assert not [n for n in line.notes if "ignored" in n or "unknown" in n], line.notes


def test_deprecated_alias_rendered_as_mtp():
    args = vllm_args(
        "srv", parse_spec(GMS().update(speculativeDecoding={"method": "qwen3_next_mtp", "numSpeculativeTokens": 1}).spec())
    )
    assert json.loads(flag_value(args, "--speculative-config"))["method"] == "mtp"


def test_spec_decode_disabled_has_no_speculative_config():
    assert "--speculative-config" not in vllm_args("srv", parse_spec(GMS().update(speculativeDecoding={"enabled": False}).spec()))


def test_pvc_model_is_mounted_read_only():
    d = deployment("srv", "ns", parse_spec(GMS().update(model={"uri": "pvc://models/qwen/Qwen3.5-27B"}).spec()))
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][0] == "/models/qwen/Qwen3.5-27B"
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_deployment_gpu_resources_probes_and_placement():
    d = deployment(
        "srv",
        "ns",
        parse_spec(
            GMS()
            .update(
                tensorParallelSize=4,
                startupBudgetSeconds=3600,
                resources={"gpuType": "NVIDIA-H100-80GB-HBM3"},
                nodeSelector={"pool": "gpu"},
                tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
            )
            .spec()
        ),
        uid="u-1",
    )
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 3600
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert any(t["key"] == "dedicated" for t in pod["tolerations"])
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    owner = d["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "u-1" and owner["controller"] is True and owner["kind"] == "GDNModelServer"
    sel = d["spec"]["selector"]["matchLabels"]
    assert all(d["spec"]["template"]["metadata"]["labels"][k] == v for k, v in sel.items())


def test_model_runner_and_secrets_as_env():
    d = deployment(
        "srv",
        "ns",
        parse_spec(
            GMS()
            .update(
                modelRunner="v2",
                model={"uri": "hf://Qwen/Qwen3.5-27B", "hfTokenSecret": {"name": "hf"}},
                env=[{"name": "NCCL_P2P_DISABLE", "value": "1"}, {"name": "X", "secretKeyRef": {"name": "s", "key": "k"}}],
            )
            .spec()
        ),
    )
    env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_USE_V2_MODEL_RUNNER"]["value"] == "1"
    # the token goes to the download step; the engine runs offline from the cache it filled
    download = {e["name"]: e for e in d["spec"]["template"]["spec"]["initContainers"][0]["env"]}
    assert download["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "HF_TOKEN" not in env and env["HF_HUB_OFFLINE"]["value"] == "1"
    assert env["NCCL_P2P_DISABLE"]["value"] == "1"
    assert env["X"]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "k"}


def test_service_and_pod_monitor():
    objs = render_all("srv", "ns", parse_spec(GMS().update(metrics={"scrapeIntervalSeconds": 30}).spec()), uid="u")
    kinds = [o["kind"] for o in objs]
    assert kinds == ["Deployment", "Service", "PodMonitor", "PodDisruptionBudget"]
    svc = objs[1]
    assert {p["name"] for p in svc["spec"]["ports"]} == {"http", "metrics"}
    assert objs[2]["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    assert [o["kind"] for o in render_all("srv", "ns", parse_spec(GMS().update(metrics={"enabled": False}).spec()))] == [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]


def test_pod_monitor_labels_and_server_label():
    """GDN_POD_MONITOR_LABELS reach the PodMonitor (kube-prometheus-stack selects `release: <name>`), our own
    labels win a clash, and every engine series gets `server` = the GDNModelServer's name (issue 28)."""
    pm = render_all(
        "srv", "ns", parse_spec(GMS().spec()), monitor_labels={"release": "kps", "app.kubernetes.io/managed-by": "x"}
    )[2]
    assert pm["metadata"]["labels"]["release"] == "kps"
    assert pm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gdn-operator"
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["relabelings"] == [{"action": "replace", "targetLabel": "server", "replacement": "srv"}]
    assert "honorLabels" not in ep
    assert "release" not in render_all("srv", "ns", parse_spec(GMS().spec()))[2]["metadata"]["labels"]


def test_bad_names_give_a_clear_error():
    with pytest.raises(RenderError, match="metadata.name 'Srv.1' cannot name the engine Service"):
        service("Srv.1", "ns", parse_spec(GMS().spec()))
    with pytest.raises(RenderError, match="at most 63 characters"):
        deployment("a" * 70, "ns", parse_spec(GMS().spec()))


def test_label_value_is_always_valid():
    assert safe_label_value("0.33.0") == "0.33.0"
    long = safe_label_value("x" * 100)
    assert len(long) <= 63
    assert safe_label_value("0.19.2rc1.dev226+g53b9640fb").replace("-", "").replace(".", "").replace("_", "").isalnum()


# ------------------------------------------------------------------------ vLLM 0.34.0 (issue 46) --


@pytest.mark.parametrize(
    "version, set_to, rendered",
    [
        ("0.34.0", None, None),  # vLLM sizes the KV cache from measured memory (config/cache.py): nothing rendered
        ("0.35.0", None, None),
        ("0.34.0", 0.85, "0.85"),  # set: rendered as always
        ("0.33.0", None, "0.9"),  # before 0.34.0: the fraction always rendered
        ("0.33.0", 0.95, "0.95"),
        ("0.34.0rc1", None, "0.9"),  # a pre-release of 0.34.0 sorts before it (vllm_features.yaml kv_cache_sizing)
    ],
)
def test_gpu_memory_utilization_renders_nothing_unset_from_0_34(version, set_to, rendered):
    fields = {} if set_to is None else {"gpuMemoryUtilization": set_to}
    spec = parse_spec(GMS().version(version).update(**fields).spec())
    argv = vllm_args("srv", spec)
    if rendered is None:
        assert "--gpu-memory-utilization" not in argv and gpu_memory_utilization(spec) is None
    else:
        assert flag_value(argv, "--gpu-memory-utilization") == rendered
    assert GPU_MEMORY_BEFORE_KV_SIZING == 0.9


@pytest.mark.parametrize("value, env", [("breakable", "1"), ("compiled", "0"), (None, None)])
def test_cudagraph_implementation_renders_vllms_breakable_switch(value, env):
    fields = {} if value is None else {"cudagraphImplementation": value}
    spec = parse_spec(GMS().version("0.34.0").update(**fields).spec())
    got = {e["name"]: e.get("value") for e in engine_env(spec)}
    assert got.get("VLLM_USE_BREAKABLE_CUDAGRAPH") == env  # vllm/envs.py reads it as == "1"
    assert not any("BREAKABLE" in a for a in vllm_args("srv", spec))  # an environment switch, no flag
