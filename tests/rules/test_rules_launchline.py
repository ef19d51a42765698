"""Raw vLLM launch lines mapped onto the same effective configuration (gdnctl validate -- ...)."""

from __future__ import annotations

import pytest
from rules_helpers import rules_of

from gdn_operator.api.load import ManifestError
from gdn_operator.rules.launchline import DEFAULT_PORT, Endpoint, evaluate_launch, parse_launch_line, read_endpoint

SC2 = '{"method":"mtp","num_speculative_tokens":2}'


def test_vllm_serve_with_json_speculative_config():
    line = parse_launch_line(
        ["--", "vllm", "serve", "Qwen/Qwen3.5-27B", "--speculative-config", SC2, "-tp", "2"], vllm_version="0.33.0"
    )
    s = line.spec
    assert s.model.uri == "hf://Qwen/Qwen3.5-27B" and line.model == "Qwen/Qwen3.5-27B"
    assert s.speculative_decoding.enabled and s.speculative_decoding.num_speculative_tokens == 2
    assert s.tensor_parallel_size == 2 and s.image.vllm_version == "0.33.0"


def test_python_module_form_with_model_flag_and_equals_values():
    line = parse_launch_line(
        [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model=Qwen/Qwen3-Next-80B-A3B-Instruct",
            "--tensor-parallel-size=4",
            f"--speculative-config={SC2}",
            "--max-num-seqs=64",
            "--max-num-batched-tokens",
            "8192",
            "--max-model-len",
            "32k",
        ],
        vllm_version="0.24.0",
    )
    s = line.spec
    assert s.tensor_parallel_size == 4 and s.max_num_seqs == 64 and s.max_num_batched_tokens == 8192
    assert s.max_model_len == 32000


def test_env_assignments_v2_runner_vllm_38041():
    _, ev = evaluate_launch(
        ["VLLM_USE_V2_MODEL_RUNNER=1", "NCCL_P2P_DISABLE=1", "vllm", "serve", "Qwen/Qwen3.5-27B"], vllm_version="0.19.1"
    )
    assert ev.effective.model_runner == "v2"
    assert "vllm#38041" in rules_of(ev, "rejected")
    assert ev.detail.values["env.NCCL_P2P_DISABLE"] == "1"


def test_single_quoted_string_is_shlex_split_vllm_36917():
    line, ev = evaluate_launch(
        [
            'vllm serve Qwen/Qwen3.5-397B-A17B -tp 8 --speculative-config \'{"method":"qwen3_next_mtp","num_speculative_tokens":1}\''
        ],
        vllm_version="0.17.0",
    )
    assert line.spec.tensor_parallel_size == 8
    assert ev.effective.spec_method == "mtp"  # deprecated alias rewritten
    assert any("deprecated alias" in n for n in ev.notes)
    assert "vllm#36917" in rules_of(ev, "rejected")
    assert ev.policy == "reject"


def test_short_sc_flag_and_flashinfer_k5_vllm_37035():
    _, ev = evaluate_launch(
        [
            "vllm",
            "serve",
            "cyankiwi/Qwen3.5-27B-AWQ-BF16-INT4",
            "-tp",
            "2",
            "-sc",
            '{"method": "qwen3_next_mtp", "num_speculative_tokens": 5}',
            "--attention-backend",
            "FLASHINFER",
        ],
        vllm_version="0.17.1rc1.dev126+gbc2c0c86e",
    )
    assert "vllm#37035" in rules_of(ev, "rejected")


def test_dotted_speculative_config_form():
    line = parse_launch_line(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.5-9B",
            "--speculative-config.method",
            "mtp",
            "--speculative-config.num_speculative_tokens",
            "3",
        ],
        vllm_version="0.33.0",
    )
    assert line.spec.speculative_decoding.num_speculative_tokens == 3


def test_async_prefix_chunked_flags_and_backends():
    line, ev = evaluate_launch(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.6-27B",
            "--speculative-config",
            SC2,
            "--no-async-scheduling",
            "--enable-prefix-caching",
            "--no-enable-chunked-prefill",
            "--gdn-prefill-backend",
            "triton",
            "--attention-backend",
            "flash_attn",
        ],
        vllm_version="0.28.0",
    )
    s = line.spec
    assert s.async_scheduling is False and s.prefix_caching is True and s.chunked_prefill is False
    assert s.gdn_prefill_backend == "triton" and s.attention_backend == "FLASH_ATTN"
    # align without chunked prefill asserts at start-up; prefix caching + MTP is vllm#43559
    assert {"vllm-config/align-requires-chunked-prefill", "vllm#43559"} <= rules_of(ev, "rejected")


def test_mamba_cache_mode_flag():
    _, ev = evaluate_launch(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.6-27B",
            "--speculative-config",
            SC2,
            "--mamba-cache-mode",
            "align",
            "--enable-prefix-caching",
        ],
        vllm_version="0.27.1",
    )
    assert ev.effective.mamba_cache_mode == "align"
    _, ev = evaluate_launch(["vllm", "serve", "Qwen/Qwen3.6-27B", "--mamba-cache-mode=none"], vllm_version="0.33.0")
    assert any("no-op" in n for n in ev.notes)


def test_compilation_config_and_enforce_eager():
    line = parse_launch_line(
        ["vllm", "serve", "Qwen/Qwen3.5-9B", "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'],
        vllm_version="0.33.0",
    )
    assert line.spec.cudagraph_mode == "FULL_DECODE_ONLY" and not line.spec.enforce_eager
    line = parse_launch_line(
        ["vllm", "serve", "Qwen/Qwen3.5-9B", "-cc", '{"cudagraph_mode": "FULL"}', "--enforce-eager"], vllm_version="0.33.0"
    )
    assert line.spec.enforce_eager and line.spec.cudagraph_mode is None


def test_dflash_budget_vllm_50708():
    _, ev = evaluate_launch(
        ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B", "--speculative-config", '{"method":"dflash","num_speculative_tokens":16}'],
        vllm_version="0.26.0",
    )
    assert ev.detail.scheduled_token_budget == -1792
    assert "vllm#50708" in rules_of(ev, "rejected")


def test_unknown_flags_are_ignored_with_a_note():
    line = parse_launch_line(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.5-9B",
            "--port",
            "8000",
            "--trust-remote-code",
            "--frobnicate",
            "7",
            "--shiny-new-switch",
            "--another=1",
        ],
        vllm_version="0.31.0",  # no option table of its own: the nearest one's, where unknown options are notes
    )
    joined = " | ".join(line.notes)
    assert "--frobnicate 7" in joined and "--shiny-new-switch" in joined and "--another=1" in joined
    assert "--port" not in joined


def test_architecture_flag_for_an_unrecognised_name():
    _, ev = evaluate_launch(["vllm", "serve", "/models/my-finetune", "--speculative-config", SC2], vllm_version="0.17.1")
    assert "gdn-operator/unrecognised-model-family" in rules_of(ev, "rejected")
    line, ev = evaluate_launch(
        ["vllm", "serve", "/models/my-finetune", "--speculative-config", SC2],
        vllm_version="0.17.1",
        architecture="qwen3_5forconditionalgeneration",
    )
    assert line.spec.model.uri == "file:///models/my-finetune"
    assert "vllm#36917" in rules_of(ev, "rejected")


def test_patches_from_the_command_line():
    _, ev = evaluate_launch(
        ["vllm", "serve", "Qwen/Qwen3.5-9B", "--speculative-config", SC2], vllm_version="0.17.1", patches=["gdn-guard/vllm-36917"]
    )
    assert "vllm#36917" not in rules_of(ev)


@pytest.mark.parametrize(
    "argv, version, needle",
    [
        (["vllm", "serve", "Qwen/Qwen3.5-9B"], None, "--vllm-version is required"),
        (["vllm", "serve", "--speculative-config", SC2], "0.33.0", "no model"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "--max-num-seqs", "lots"], "0.33.0", "--max-num-seqs: expected an integer"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "-sc", "{method: mtp}"], "0.33.0", "-sc: not valid JSON"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "-sc", '{"num_speculative_tokens": 2}'], "0.33.0", "'method' is missing"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "--gdn-prefill-backend", "magic"], "0.33.0", "unknown backend 'magic'"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "--tensor-parallel-size"], "0.33.0", "--tensor-parallel-size: missing value"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B", "--max-model-len", "8"], "0.33.0", "--max-model-len"),
        (["docker", "run", "vllm"], "0.33.0", "unknown command 'docker'"),
        (["vllm serve 'Qwen/Qwen3.5-9B"], "0.33.0", "cannot split"),
        (["vllm", "serve", "Qwen/Qwen3.5-9B"], "0.33.0", None),
    ],
)
def test_launch_line_errors(argv, version, needle):
    if needle is None:
        parse_launch_line(argv, vllm_version=version)
        return
    with pytest.raises(ManifestError) as ei:
        parse_launch_line(argv, vllm_version=version, architecture=None)
    assert any(needle in p for p in ei.value.problems), ei.value.problems


def test_bad_architecture():
    with pytest.raises(ManifestError, match="unknown architecture"):
        parse_launch_line(["vllm", "serve", "x/y"], vllm_version="0.33.0", architecture="LlamaForCausalLM")


# issue 16: JSON-carried settings vLLM accepts are understood like their dedicated flags


@pytest.mark.parametrize(
    "extra",
    [
        ["--additional-config", '{"gdn_prefill_backend": "triton"}'],
        ['--additional-config={"gdn_prefill_backend": "TRITON", "enable_cpu_binding": true}'],
        ["--additional-config.gdn_prefill_backend", "triton"],
    ],
)
def test_additional_config_gdn_prefill_backend_flashinfer_3329(extra):
    line, ev = evaluate_launch(
        ["vllm", "serve", "Qwen/Qwen3.5-35B-A3B", "-tp", "2", "--speculative-config", SC2, *extra], vllm_version="0.21.0"
    )
    assert line.spec.gdn_prefill_backend == "triton"
    assert "flashinfer#3329" not in rules_of(ev, "warned") | rules_of(ev, "rejected")
    _, ev = evaluate_launch(
        ["vllm", "serve", "Qwen/Qwen3.5-35B-A3B", "-tp", "2", "--speculative-config", SC2], vllm_version="0.21.0"
    )
    assert "flashinfer#3329" in rules_of(ev, "warned")


def test_additional_config_bad_backend_and_disagreement():
    with pytest.raises(ManifestError, match=r"--additional-config: gdn_prefill_backend 'fast'"):
        parse_launch_line(
            ["vllm", "serve", "Qwen/Qwen3.5-9B", "--additional-config", '{"gdn_prefill_backend": "fast"}'], vllm_version="0.33.0"
        )
    line = parse_launch_line(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.5-9B",
            "--gdn-prefill-backend",
            "flashinfer",
            "--additional-config",
            '{"gdn_prefill_backend": "triton", "foo": 1}',
        ],
        vllm_version="0.33.0",
    )
    assert line.spec.gdn_prefill_backend == "flashinfer"
    assert any("disagree" in n for n in line.notes) and any("'foo'" in n for n in line.notes)


def test_hf_overrides_architectures_reveal_the_family():
    line, ev = evaluate_launch(
        [
            "vllm",
            "serve",
            "/models/my-finetune",
            "--speculative-config",
            SC2,
            "--hf-overrides",
            '{"architectures": ["Qwen3_5ForConditionalGeneration"]}',
        ],
        vllm_version="0.17.1",
    )
    assert line.spec.model.architecture == "Qwen3_5ForConditionalGeneration"
    assert "gdn-operator/unrecognised-model-family" not in rules_of(ev, "rejected")
    assert "vllm#36917" in rules_of(ev, "rejected")


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_enable_disable_spellings_read_as_vllm_stores_them(version):
    """vLLM 0.33.0+ pairs `--enable-x` with `--disable-x` (EnableDisableAction); the reader must take the
    `--disable-` form as OFF, as vLLM does, not as the `--enable-` option it shares a destination with."""
    line = parse_launch_line(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3.6-27B",
            "--speculative-config",
            SC2,
            "--disable-prefix-caching",
            "--disable-chunked-prefill",
        ],
        vllm_version=version,
    )
    assert line.spec.prefix_caching is False and line.spec.chunked_prefill is False
    line = parse_launch_line(
        ["vllm", "serve", "Qwen/Qwen3.6-27B", "--speculative-config", SC2, "--enable-prefix-caching", "--no-async-scheduling"],
        vllm_version=version,
    )
    assert line.spec.prefix_caching is True and line.spec.async_scheduling is False


@pytest.mark.parametrize(
    ("argv", "endpoint"),
    [
        (["vllm", "serve", "m"], Endpoint(DEFAULT_PORT, None)),
        (["vllm", "serve", "m", "--port", "9001"], Endpoint(9001, None)),
        (["vllm", "serve", "m", "--port=81"], Endpoint(81, None)),
        (["vllm", "serve", "m", "--port", "80", "--port", "9002"], Endpoint(9002, None)),  # argparse: the last one
        (["vllm", "serve", "m", "--port", "http"], Endpoint(DEFAULT_PORT, None)),  # not a port: vLLM's default
        (["vllm", "serve", "/m", "--served-model-name", "recall", "--port", "8000"], Endpoint(8000, "recall")),
        (["vllm", "serve", "/m", "--served-model-name=a", "--served-model-name", "b"], Endpoint(DEFAULT_PORT, "a")),
        (["vllm", "serve", "/m", "--served-model-name="], Endpoint(DEFAULT_PORT, None)),
        (["HF_HOME=/cache", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--port", "7"], Endpoint(7)),
    ],
)
def test_the_line_says_where_its_engine_serves(argv, endpoint):
    """The port and served name (what a guard scrapes and probes) come from the flag loop that reads the rest of the
    line: on the parsed line, and without a release (a guarded engine whose release is unknown is still scraped)."""
    assert parse_launch_line(argv, vllm_version="0.33.0").endpoint == endpoint
    assert read_endpoint(argv) == endpoint


def test_the_endpoint_of_a_line_read_with_its_release_resolves_abbreviations():
    """With the release's option table an abbreviated --port is the port (vLLM's parser reads it so)."""
    line = parse_launch_line(["vllm", "serve", "m", "--por", "9003"], vllm_version="0.33.0")
    assert line.endpoint.port == 9003


def test_a_line_the_flag_loop_cannot_read_has_the_default_endpoint():
    """vLLM would exit at start on it: nothing listens; the guard still has a port to try (the default)."""
    assert read_endpoint(["vllm", "serve", "m", "--port", "9001", "--speculative-config", "{not json"]) == Endpoint()
    assert read_endpoint([]) == Endpoint()
