"""spec.extraArgs / spec.env resolved with vLLM's generated option table (issue 11, part 1).

The engine-tier twin, tests/api/test_vllm_args_oracle.py, checks the same resolution against vLLM's real
parser with generated spellings.
"""

import re

import pytest
import yaml

from gdn_operator.api import flags, vllm_args
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.rules import effective_config

from builders import GMS

EXACT = "0.32.0"  # the release the shipped table was generated from
BASE = GMS().version(EXACT).spec()


def problems(args, version=EXACT):
    return vllm_args.resolve_extra_args(args, version).problems


# Each spelling below was admitted by the old deny-list (issue 11 §1) and lands on an owned or
# rule-relevant destination in vLLM 0.32.0's real parser.
@pytest.mark.parametrize(
    "args, dest_hint",
    [
        (["--spec-method=mtp", "--spec-tokens=2"], "spec.speculativeDecoding.method"),  # vllm#43559 bypass
        (["--spec-model", "x"], "spec.speculativeDecoding"),
        (["--as"], "spec.asyncScheduling"),  # abbreviation undoing a mitigate policy (vllm#36917)
        (["--no-async"], "spec.asyncScheduling"),
        (["--gd=triton"], "spec.gdnPrefillBackend"),
        (["--te=2"], "spec.tensorParallelSize"),
        (["-t", "2"], "spec.tensorParallelSize"),  # single-dash abbreviation of -tp
        (["-tp=2"], "spec.tensorParallelSize"),
        (["--device-memory-utilization", "0.5"], "spec.gpuMemoryUtilization"),
        (["-cc.cudagraph_mode=NONE"], "spec.cudagraphMode"),
        (["--compilation-config.mode", "0"], "spec.cudagraphMode"),
        (["--compilation.mode=3"], "spec.cudagraphMode"),  # abbreviated dotted key
        (["-c", '{"mode":0}'], "spec.cudagraphMode"),
        (["-ac", '{"backend":"TRITON_ATTN"}'], "spec.attentionBackend"),
        (["-ac.backend=TRITON_ATTN"], "spec.attentionBackend"),
        (["-s", '{"method":"mtp","num_speculative_tokens":4}'], "spec.speculativeDecoding"),
        (["--speculative-config.num_speculative_tokens", "4"], "spec.speculativeDecoding"),
        (["--no-enforce-eager"], "spec.enforceEager"),
        (["--enforce"], "spec.enforceEager"),
        (["--enable-prefix"], "spec.prefixCaching"),
        (["--no-enable-prefix-caching"], "spec.prefixCaching"),
        (["--mamba-cache-mode=align"], "spec.prefixCaching"),
        (["--max_num_seqs=4"], "spec.maxNumSeqs"),
        (["--hf-token=hf_abcdefghijklmnop"], "spec.model.hfTokenSecret"),
        (["--hf-token"], "spec.model.hfTokenSecret"),
        (["--served-model-name", "x"], "spec.model.servedName"),
        (["--port=9000"], "port 8000"),
        (["-pp", "2"], "spec.pipelineParallelSize"),
        (["--nn", "2"], "spec.nodes"),
        (["--shutdown-timeout=5"], "spec.shutdownTimeoutSeconds"),
        (["-dp", "2"], "spec.replicas"),
    ],
)
def test_owned_destinations_refused_whatever_the_spelling(args, dest_hint):
    found = problems(args)
    assert found and "which the operator owns" in found[0] and dest_hint in found[0], found
    assert found[0].startswith("extraArgs[0] ")


@pytest.mark.parametrize(
    "args, reason",
    [
        (['--additional-config={"x":1}'], "gdn-guard"),
        (["--additional-config.x", "1"], "gdn-guard"),
        (["-O3"], "CUDA graph mode"),
        (["-O", "0"], "CUDA graph mode"),
        (["-O=1"], "CUDA graph mode"),
        (["--optimization-level", "0"], "CUDA graph mode"),
        (["--hf-overrides", '{"architectures":["LlamaForCausalLM"]}'], "architecture"),
        (["--kernel-config", "{}"], "kernels"),
        (["--scheduler-cls", "x.Y"], "scheduler"),
        (["--worker-extension-cls", "x.Y"], "worker"),
        (["--max-num-scheduled-tokens", "10"], "B14"),
        (["--help"], "exits"),
        (["--help=all"], "exits"),
    ],
)
def test_rule_relevant_destinations_refused(args, reason):
    found = problems(args)
    assert found and "known-crash rules cannot see" in found[0] and reason in found[0], found


def test_config_file_refused_in_every_form():
    assert "'--config' would set vLLM options the known-crash rules cannot see" in problems(["--config", "/x.yaml"])[0]
    assert "known-crash rules cannot see" in problems(["--config=/x.yaml"])[0]
    assert "ambiguous option" in problems(["--conf", "/x.yaml"])[0]  # --config or --config-format: vLLM exits


@pytest.mark.parametrize(
    "args, text",
    [
        (["--no-such-option"], "is not an option of vLLM 0.32.0"),
        (["--seed", "x"], "invalid int value"),
        (["--dtype", "bogus"], "invalid choice"),
        (["--max-logprobs"], "expected one argument"),
        (["stray"], "is not an option and not the value of one"),
        (["--no-ena"], "ambiguous option"),
        (["--"], "would end vLLM's options"),
        (["-cc.mode"], "needs a value"),
        (["--lora_modules", "auto"], "invalid _lora_module value"),  # bench_fuzz found it: vLLM exits
    ],
)
def test_arguments_that_make_vllm_exit_are_refused(args, text):
    found = problems(args)
    assert found and text in " ".join(found), found


@pytest.mark.parametrize(
    "args",
    [
        ["--trust-remote-code", "--max-logprobs=5", "--seed", "1"],
        ["--kv_cache_dtype=fp8"],
        ["-q", "fp8"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        ["--allowed-media-domains", "a.example", "b.example"],
        ["--cudagraph-capture-sizes", "1", "2", "4"],
        ["--long-prefill-token-threshold", "8000"],
        ["--safetensors-prefetch-block-size", "8M"],
        ["--enable-lora", "--lora-modules", "a=/x", '{"name":"b","path":"/y"}'],
    ],
)
def test_ordinary_options_admitted(args):
    assert problems(args) == []


@pytest.mark.parametrize("args", [["--api-key", "sk-1"], ["--api-key=sk-1"], ["--api-ke", "sk-1", "sk-2"], ["--api_key", "x"]])
def test_literal_api_key_refused_like_hf_token(args):
    """A key in the pod's arguments is readable by anyone who can read the Deployment (issue 29 part 4)."""
    found = " ".join(problems(args))
    assert "which the operator owns" in found and "set spec.apiKeySecret (" in found, found
    assert "sk-1" not in found  # the refusal never echoes the key


def test_abbreviations_resolve_like_argparse():
    r = vllm_args.resolve_extra_args(["--trust-rem", "--max-logp=5"], EXACT)
    assert r.problems == []
    assert r.flags == {"--trust-remote-code", "--max-logprobs"}


def test_has_arg_predicates_see_the_resolved_option():
    spec = parse_spec({**BASE, "extraArgs": ["--kv_cache_dtype=fp8", "--trust-rem"]})
    assert effective_config(spec).values["extra_args_flags"] == {"--kv-cache-dtype", "--trust-remote-code"}


# ---------------------------------------------------------------------------- version policy ---


def test_exact_table_for_its_release():
    table, exact = vllm_args.select_table(EXACT)
    assert (table.version, exact) == (EXACT, True)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_each_generated_release_has_its_own_table(version):
    table, exact = vllm_args.select_table(version)
    assert (table.version, exact) == (version, True)


@pytest.mark.parametrize(
    "version, nearest",
    [
        ("0.33.0rc1", "0.32.0"),
        ("0.32.1", "0.32.0"),
        ("0.19.1", "0.32.0"),
        ("0.33.1", "0.33.0"),
        ("0.34.1", "0.34.0"),
        ("0.35.0", "0.34.0"),
    ],
)
def test_other_releases_use_the_nearest_table_strictly(version, nearest):
    table, exact = vllm_args.select_table(version)
    assert table.version == nearest and exact is False
    found = problems(["--as"], version)
    assert any("write options in full" in p for p in found), found
    assert problems(["--trust-rem"], version) and problems(["--trust-remote-code"], version) == []
    assert f"is not an option of vLLM {nearest}" in problems(["--option-from-the-future"], version)[0]


def test_unparseable_version_admits_no_extra_args():
    assert "not a release version" in problems(["--trust-remote-code"], "latest")[0]
    assert problems([], "latest") == []


# ------------------------------------------------------------------------------ policy coverage ---


def test_every_rule_relevant_looking_destination_is_classified():
    """A regenerated table with a new owned-looking destination fails here until the policy says what it is."""
    pol = vllm_args.policy()
    classified = set(pol["owned"]) | set(pol["rule_relevant"]) | set(pol["reviewed_allowed"])
    pattern = re.compile(pol["review_pattern"])
    for version in vllm_args.table_versions():
        table = yaml.safe_load((vllm_args._TABLES / f"{version}.yaml").read_text())
        dests = {o["dest"] for o in table["options"]}
        unclassified = sorted(d for d in dests if pattern.search(d) and d not in classified)
        assert unclassified == [], f"classify in extra-args-policy.yaml (vLLM {version}): {unclassified}"


def test_policy_names_real_destinations():
    pol = vllm_args.policy()
    dests = set()
    for version in vllm_args.table_versions():
        dests |= {o["dest"] for o in yaml.safe_load((vllm_args._TABLES / f"{version}.yaml").read_text())["options"]}
    stale = sorted(d for d in set(pol["owned"]) | set(pol["rule_relevant"]) | set(pol["reviewed_allowed"]) if d not in dests)
    assert stale == []


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_table_is_generated_from_the_real_parser(version):
    table = yaml.safe_load((vllm_args._TABLES / f"{version}.yaml").read_text())
    assert table["generated_by"] == "hack/gen_vllm_options.py" and table["vllm_version"] == version
    assert table["parser"]["preprocessing"] == {
        "underscore_to_dash": True,
        "dotted_json_keys": True,
        "o_level_shorthand": True,
        "config_file": True,
    }
    by_dest = {o["dest"]: o for o in table["options"]}
    assert by_dest["gpu_memory_utilization"]["options"] == ["--gpu-memory-utilization", "--device-memory-utilization"]
    assert by_dest["spec_method"]["options"] == ["--spec-method"]


# ------------------------------------------------------------------------------------------ env ---


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PATH"])
def test_process_env_refused_without_opt_in(name):
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, "env": [{"name": name, "value": "/secret/value"}]})
    msg = str(e.value)
    assert f"spec.env: env[0] {name!r}" in msg and "spec.allowUnsafeEnv" in msg
    assert "/secret/value" not in msg  # values are never echoed
    spec = parse_spec({**BASE, "allowUnsafeEnv": [name], "env": [{"name": name, "value": "/opt/lib"}]})
    assert spec.env[0].name == name


@pytest.mark.parametrize("name", ["VLLM_ATTENTION_BACKEND", "VLLM_GDN_DECODE_KERNEL", "VLLM_USE_V2_MODEL_RUNNER", "HF_TOKEN"])
def test_rule_relevant_or_owned_env_refused_even_with_opt_in(name):
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, "allowUnsafeEnv": [name], "env": [{"name": name, "value": "hf_abcdefghijklmnop"}]})
    assert f"env[0] {name!r}" in str(e.value) and "hf_abcdefghijklmnop" not in str(e.value)


def test_ordinary_vllm_env_admitted():
    spec = parse_spec(
        {**BASE, "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "NCCL_P2P_DISABLE", "value": "1"}]}
    )
    assert [e.name for e in spec.env] == ["VLLM_LOGGING_LEVEL", "NCCL_P2P_DISABLE"]


def test_spec_message_names_field_and_never_the_token_value():
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, "extraArgs": ["--trust-remote-code", "--hf-token", "hf_abcdefghijklmnopqrstuv"]})
    msg = str(e.value)
    assert msg.startswith("spec.extraArgs: extraArgs[1] '--hf-token' sets --hf-token") and "hf_abcdef" not in msg
    with pytest.raises(ManifestError) as e:
        parse_spec({**BASE, "extraArgs": ["hf_abcdefghijklmnopqrstuv"]})
    assert "hf_abcdef" not in str(e.value) and "<redacted>" in str(e.value)


# ------------------------------------------------------------------------- 0.33.0 and 0.34.0 ---
# vLLM 0.33.0 registers every BooleanOptionalAction as its EnableDisableAction (vllm/utils/argparse_utils.py):
# `--enable-x` pairs with `--disable-x`, and `--no-enable-x` stays registered but hidden from help. The generated
# tables list the hidden strings and which strings store False (`negative`, found by calling the action).


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_enable_disable_pairs_carry_their_negative_forms(version):
    by_dest = {o["dest"]: o for o in yaml.safe_load((vllm_args._TABLES / f"{version}.yaml").read_text())["options"]}
    pc = by_dest["enable_prefix_caching"]
    assert (pc["action"], pc["options"]) == (
        "EnableDisableAction",
        ["--enable-prefix-caching", "--disable-prefix-caching", "--no-enable-prefix-caching"],
    )
    assert pc["negative"] == ["--disable-prefix-caching", "--no-enable-prefix-caching"]
    assert by_dest["async_scheduling"]["negative"] == ["--no-async-scheduling"]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize(
    "args, dest_hint",
    [
        (["--disable-prefix-caching"], "spec.prefixCaching"),
        (["--no-enable-prefix-caching"], "spec.prefixCaching"),  # hidden from help, still accepted
        (["--disable-prefix"], "spec.prefixCaching"),  # abbreviation of the new spelling
        (["--disable-chunked-prefill"], "spec.chunkedPrefill"),
        (["--no-enforce-eager"], "spec.enforceEager"),
        (["--as"], "spec.asyncScheduling"),
    ],
)
def test_owned_destinations_refused_in_the_enable_disable_spellings(version, args, dest_hint):
    found = problems(args, version)
    assert found and "which the operator owns" in found[0] and dest_hint in found[0], found


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize(
    "args, dest, value",
    [
        (["--disable-prefix-caching"], "enable_prefix_caching", False),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--enable-prefix-caching"], "enable_prefix_caching", True),
        (["--disable-chunked-prefill"], "enable_chunked_prefill", False),
        (["--enable-sliding-window"], "disable_sliding_window", False),  # the inverse of a --disable-x option
        (["--no-async-scheduling"], "async_scheduling", False),
    ],
)
def test_enable_disable_values_are_what_vllm_stores(version, args, dest, value):
    """Without the table's `negative` list, `--disable-x` would read as `--enable-x` (both set the same dest)."""
    assert vllm_args.option_values(args, version) == {dest: value}
    option, read_dest, const = vllm_args.read_option(vllm_args.load_table(version), args[0])
    assert (option, read_dest, const) == (args[0], dest, value)


NEW_IN_0_34 = [
    ["--enable-extensible-kv-cache"],
    ["--disable-extensible-kv-cache"],
    ["--cache-aware-admission-window", "8", "--cache-aware-admission-threshold", "0.25"],
    ["--max-num-inflight-kv-loads", "4"],
    ["--shuffle-safetensors-files"],
    ["--checkpoint-prepare-on-startup"],
]


@pytest.mark.parametrize("args", NEW_IN_0_34)
def test_options_new_in_0_34_admitted_at_0_34(args):
    assert problems(args, "0.34.0") == []
    assert problems(args, "0.34.1") == []  # nearest table, options spelled in full


@pytest.mark.parametrize("args", NEW_IN_0_34)
def test_options_new_in_0_34_refused_where_vllm_lacks_them(args):
    assert "is not an option of vLLM 0.33.0" in problems(args, "0.33.0")[0]


def test_new_options_get_their_checks():
    assert "invalid int value" in " ".join(problems(["--cache-aware-admission-window", "x"], "0.34.0"))
    assert "invalid float value" in " ".join(problems(["--cache-aware-admission-threshold", "half"], "0.34.0"))


@pytest.mark.parametrize(
    "args, version",
    [
        (["--monokernel"], "0.33.0"),
        (["--sleep-mode-backend", "cumem"], "0.33.0"),
        (['--watchdog-config={"timeout":60}'], "0.33.0"),
    ],
)
def test_options_new_in_0_33_admitted(args, version):
    assert problems(args, version) == []
    assert problems(args, "0.34.0") == []


def _rendered_spellings() -> list[tuple[str, object]]:
    """(option, the value an on/off option stores or None) for every option string the renderer writes."""
    out: list[tuple[str, object]] = []
    for value in vars(flags).values():
        if isinstance(value, flags.Flag):
            out.append((value.flag, True if value.kind == "bool" else None))
            out += [(a, None) for a in value.aliases]
            if value.off:
                out.append((value.off, False))
        elif isinstance(value, str) and value.startswith("--"):
            out.append((value, None))
    return sorted(set(out), key=str)


@pytest.mark.parametrize("version", vllm_args.table_versions())
def test_every_option_the_renderer_writes_exists_in_each_release_table(version):
    """A release that drops or renames a spelling we render (e.g. the hidden `--no-enable-prefix-caching` of
    0.33.0+) fails here when its table is added, before a rendered server fails to start."""
    table = vllm_args.load_table(version)
    for spelling, stores in _rendered_spellings():
        option, dest, const = vllm_args.read_option(table, spelling)
        assert option == spelling, f"vLLM {version} has no {spelling} (reads it as {option})"
        if stores is not None:
            assert const is stores, f"vLLM {version}: {spelling} stores {const} in {dest}"
