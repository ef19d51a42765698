"""The EFFECTIVE vLLM configuration of a GDNModelServer: vLLM's version-dependent defaults resolved.

Most of the known GDN + MTP bugs are triggered by *defaults*, not opt-ins, so the rules are evaluated
against what vLLM will actually run, not against what the spec says. The defaults below are those of
shared/docs/vllm-known-issues.md (beside the checkout) §2 (checked in the released wheels 0.17.0–0.33.0), and
the 0.34.0 wheel (issue 46, the facts in docs/safe-defaults.md):

* async scheduling: unset → on when the speculative method is EAGLE/MTP-type (all catalogued versions); from
  0.34.0 on for every generative model (config/vllm.py VllmConfig.__post_init__: 0.33.0's V1-runner exceptions
  are gone with the V1 runner);
* prefix caching for hybrid (GDN) models: unset → off on 0.17.0–0.27.1 (opt-in), on from 0.28.0 (the catalogue
  said 0.26.0; the wheels and a 0.26.0 GPU run say 0.28.0);
* mamba cache mode for Qwen3.5 / Qwen3-Next: follows prefix caching (on → ``align``, off → ``none``);
  an explicit ``--mamba-cache-mode`` (launch lines only) is honoured up to 0.32.0 and is a no-op in 0.33.0;
* chunked prefill: unset → on (vLLM V1 default; implied by §2: the 0.26.0+ default config resolves to
  ``align``, and ``align`` asserts that chunked prefill is on, yet that default config starts);
* model runner (``spec.modelRunner: auto``, ``VLLM_USE_V2_MODEL_RUNNER`` unset): V1 up to 0.28.0, V2 from
  0.29.0, and V2 only from 0.34.0 (the V1 runner was removed; platforms/interface.py refuses the variable set to
  anything but ``1``). ``v1``/``v2`` set ``VLLM_USE_V2_MODEL_RUNNER=0/1``, which vLLM parses with ``int()``;
* CUDA-graph implementation (``spec.cudagraphImplementation``, ``VLLM_USE_BREAKABLE_CUDAGRAPH``): unset →
  breakable for the Qwen3.5 classes on NVIDIA from 0.34.0 (config/vllm.py ``_QWEN3_5_ARCHITECTURES``,
  ``default_breakable_cudagraph_architectures``), compiled (torch.compile) otherwise;
* speculative method: ``qwen3_next_mtp`` and ``qwen3_5_mtp`` (any ``*_mtp``) are rewritten to ``mtp``.

The architecture comes from ``spec.model.architecture`` or is inferred from the model name (the published
checkpoints and name patterns of rules/family.py); anything else is *unrecognised*, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gdn_operator.api.enums import Architecture, CudagraphImplementation
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.status import DefaultedField
from gdn_operator.api.status import EffectiveConfig as EffectiveConfigStatus
from gdn_operator.api.vllm_args import resolve_extra_args
from gdn_operator.rules.family import infer_architecture
from gdn_operator.rules.layout import attention_groups, model_layout
from gdn_operator.versions import Version, parse_version, require_version

GDN_ARCHITECTURES = frozenset(a.value for a in Architecture)

#: Methods vLLM treats as MTP (§5: every MTP type other than `mtp` is rewritten to `mtp` with a warning).
MTP_ALIASES = frozenset({"mtp", "qwen3_next_mtp", "qwen3_5_mtp"})
#: EAGLE-type methods (MTP is in vLLM's EagleModelTypes): async scheduling defaults on with them (§2).
EAGLE_TYPES = frozenset({"eagle", "eagle3", "mtp", "dflash"})
#: Methods that draft in parallel and so add (k-1) batch slots per request (#50708 arithmetic).
PARALLEL_DRAFTING_METHODS = frozenset({"dflash"})

# vllm/engine/arg_utils.py `_set_default_chunked_prefill_and_prefix_caching_args`: "Hybrid models support prefix
# caching but keep it opt-in for now" (`... and not model_config.is_hybrid`) in every wheel up to 0.27.1, gone from
# 0.28.0 (read in the 0.26.0-0.33.0 wheels); the 0.26.0 engines of tests/fixtures/vllm-0.26.0-h200x2-release
# resolved enable_prefix_caching=False with the flag unset.
PREFIX_CACHING_HYBRID_DEFAULT_ON = require_version("0.28.0")
V2_RUNNER_DEFAULT_FROM = require_version("0.29.0")
MAMBA_MODE_FLAG_NOOP_FROM = require_version("0.33.0")
V2_ENV_TRISTATE_FROM = require_version("0.22.0")
#: v1/worker/gpu_model_runner.py is gone from the 0.34.0 wheel; platforms/interface.py validate_environ refuses
#: VLLM_USE_V2_MODEL_RUNNER != "1" (rule vllm-config/v1-runner-removed)
V1_RUNNER_REMOVED_IN = require_version("0.34.0")
#: config/vllm.py VllmConfig.__post_init__ at 0.34.0: async scheduling on unless pooling / no executor support
ASYNC_ON_FOR_ALL_FROM = require_version("0.34.0")
#: config/vllm.py default_breakable_cudagraph_architectures() adds _QWEN3_5_ARCHITECTURES on CUDA from 0.34.0
BREAKABLE_QWEN3_5_DEFAULT_FROM = require_version("0.34.0")
#: the HF classes of config/vllm.py _QWEN3_5_ARCHITECTURES this operator serves (Qwen3-Next is not among them)
BREAKABLE_DEFAULT_ARCHITECTURES = frozenset(a.value for a in Architecture if a.value.startswith("Qwen3_5"))

#: Assumed vLLM defaults for the OpenAI server when unset (see B14 in the rule file).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass
class LaunchOverrides:
    """What a raw `vllm serve` line says that a GDNModelServerSpec cannot hold (see launchline.py)."""

    env: dict[str, str] = field(default_factory=dict)
    spec_method: str | None = None  # a non-MTP method (dflash, eagle3, ngram ...) or an MTP alias
    num_speculative_tokens: int | None = None  # when outside the spec's 1..16 range
    parallel_drafting: bool | None = None
    mamba_cache_mode: str | None = None
    architecture_source: str | None = None
    not_gdn: str | None = None  # a config names this non-GDN class (rules/family.py): never inferred from the name
    #: other options the line sets, spelled in full (`has_arg` predicates read them as they read spec.extraArgs)
    extra_flags: set[str] = field(default_factory=set)


class Effective:
    """The resolved configuration. `values` is what rule predicates read (see FIELDS)."""

    __slots__ = ("version", "values", "sources", "notes", "described")

    def __init__(self, version: Version | None, values: dict[str, Any], sources: dict[str, str], notes: list[str]):
        self.version = version
        self.values = values
        self.sources = sources
        self.notes = notes
        #: describe_field's phrase per spec path, made once (many findings describe the same fields)
        self.described: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:  # convenience: eff.prefix_caching
        try:
            return self.__getattribute__("values")[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_status(self, defaults: Sequence[Any] = (), costs: Mapping[str, str] | None = None) -> EffectiveConfigStatus:
        """The status view; `defaults` are rules.defaults.Default records (field, value, rule), `costs` what each
        defaulted field measurably costs (rules/cost.py default_cost)."""
        v = self.values
        return EffectiveConfigStatus.model_construct(
            vllm_version=v["vllm_version"],
            async_scheduling=v["async_scheduling"],
            prefix_caching=v["prefix_caching"],
            mamba_cache_mode=v["mamba_cache_mode"],
            model_runner=v["model_runner"],
            spec_method=v["spec_method"] if v["spec_enabled"] else None,
            architecture=v["architecture"],
            gdn_prefill_backend=v["gdn_prefill_backend"],
            cudagraph_mode=v["cudagraph_mode"],
            cudagraph_implementation=v["cudagraph_implementation"],
            defaults=[
                DefaultedField.model_construct(field=d.field, value=d.value, rule=d.rule, cost=(costs or {}).get(d.field, ""))
                for d in defaults
            ],
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (CLI output): every resolved value, plus where defaults came from."""
        out = {k: v for k, v in self.values.items() if not k.startswith("env.") and k != "extra_args_flags"}
        out["env"] = {k[4:]: v for k, v in self.values.items() if k.startswith("env.")}
        out["extra_args_flags"] = sorted(self.values["extra_args_flags"])
        out["patches"] = sorted(self.values["patches"])
        out["vllm_version_parsed"] = str(self.version) if self.version else None
        out["sources"] = dict(self.sources)
        return out


#: what a spec without a launch line has (read here, never changed: effective_config only reads its overrides)
_NO_OVERRIDES = LaunchOverrides()

#: Effective fields rule predicates may reference (besides env.NAME), with the spec path behind each.
FIELDS: dict[str, str] = {
    "vllm_version": "spec.image.vllmVersion",
    "architecture": "spec.model.architecture",
    "gdn_hybrid": "spec.model.architecture",
    "spec_enabled": "spec.speculativeDecoding.enabled",
    "spec_method": "spec.speculativeDecoding.method",
    "spec_method_requested": "spec.speculativeDecoding.method",
    "mtp": "spec.speculativeDecoding",
    "num_speculative_tokens": "spec.speculativeDecoding.numSpeculativeTokens",
    "parallel_drafting": "spec.speculativeDecoding",
    "draft_slots_per_request": "spec.speculativeDecoding",
    "async_scheduling": "spec.asyncScheduling",
    "prefix_caching": "spec.prefixCaching",
    "mamba_cache_mode": "spec.prefixCaching",
    "chunked_prefill": "spec.chunkedPrefill",
    "model_runner": "spec.modelRunner",
    "v2_runner_env": "spec.modelRunner",
    "v2_runner_env_valid": "spec.modelRunner",
    "tensor_parallel_size": "spec.tensorParallelSize",
    "pipeline_parallel_size": "spec.pipelineParallelSize",
    "nodes": "spec.nodes",
    "shutdown_timeout": "spec.shutdownTimeoutSeconds",
    "max_model_len": "spec.maxModelLen",
    "max_num_seqs": "spec.maxNumSeqs",
    "max_num_batched_tokens": "spec.maxNumBatchedTokens",
    "scheduled_token_budget": "spec.maxNumBatchedTokens",
    "attention_backend": "spec.attentionBackend",
    "gdn_prefill_backend": "spec.gdnPrefillBackend",
    "cudagraph_mode": "spec.cudagraphMode",
    "cudagraph_implementation": "spec.cudagraphImplementation",
    "cudagraph_implementation_set": "spec.cudagraphImplementation",
    "enforce_eager": "spec.enforceEager",
    "patches": "spec.image.patches",
    "attention_kv_groups": "spec.model.uri",
}

#: speculative methods that add no attention layer of their own (anything else but MTP: drafter layers unknown)
NO_DRAFTER_LAYERS = frozenset({"ngram", "suffix"})


def _attention_kv_groups(uri: str | None, spec_method: str | None, version: Version | None) -> tuple[int | None, str]:
    """How many full-attention KV-cache groups vLLM forms for the GDN hybrid at `uri`, and from what (None: unknown)."""
    lay = model_layout(uri) if uri is not None else None
    if lay is None:
        return None, "unknown: no readable config.json and no layer layout in the checkpoint table"
    if spec_method is not None and spec_method != "mtp" and spec_method not in NO_DRAFTER_LAYERS:
        return None, f"unknown: the {spec_method} drafter's attention layers are not known"
    mtp = spec_method == "mtp"
    mtp_part = f" + {lay.mtp} MTP" if mtp and lay.mtp else ""
    return (
        attention_groups(lay, mtp=mtp, version=version),
        f"{lay.full_attention} full-attention{mtp_part} vs {lay.linear_attention} GDN layers ({lay.source})",
    )


def _on(b: bool | None) -> str:
    return "unknown" if b is None else ("on" if b else "off")


def effective_config(
    spec: GDNModelServerSpec,
    vllm_version: str | None = None,
    *,
    overrides: LaunchOverrides | None = None,
) -> Effective:
    """Resolve vLLM's defaults for `spec` at `vllm_version` (default: spec.image.vllmVersion).

    Never raises for a valid spec; an unparseable version leaves version-dependent values None.
    """
    ov = overrides or _NO_OVERRIDES
    raw_version = vllm_version if vllm_version is not None else spec.image.vllm_version
    version = parse_version(raw_version)
    notes: list[str] = []
    sources: dict[str, str] = {}
    v: dict[str, Any] = {"vllm_version": raw_version, "model_name": spec.model.name_for_inference}

    # --- architecture -----------------------------------------------------------------------
    arch: str | None = spec.model.architecture  # Architecture is a str enum
    if arch is not None:
        sources["architecture"] = ov.architecture_source or "spec.model.architecture"
    elif ov.not_gdn is not None:
        sources["architecture"] = f"{ov.architecture_source} names {ov.not_gdn} (not a GDN hybrid)"
    else:
        arch = infer_architecture(spec.model.name_for_inference)
        if arch is not None:
            sources["architecture"] = f"inferred from model name {spec.model.name_for_inference!r}"
    v["architecture"] = arch
    gdn = arch in GDN_ARCHITECTURES
    v["gdn_hybrid"] = gdn

    # --- speculative decoding ---------------------------------------------------------------
    sd = spec.speculative_decoding
    requested = ov.spec_method or (sd.method if sd.enabled else None)
    enabled = bool(sd.enabled or ov.spec_method)
    method: str | None = None
    if enabled and requested is not None:
        method = "mtp" if (requested in MTP_ALIASES or requested.endswith("_mtp")) else requested
        if method == "mtp" and requested != "mtp":
            notes.append(f"speculative method {requested!r} is a deprecated alias; vLLM rewrites it to 'mtp'")
    k = (ov.num_speculative_tokens or sd.num_speculative_tokens) if enabled else 0
    parallel = bool(ov.parallel_drafting) or method in PARALLEL_DRAFTING_METHODS
    slots = 0
    if enabled:
        if parallel:
            slots = max(k - 1, 0)
        if method == "draft_model":
            slots += 1
    v.update(
        spec_enabled=enabled,
        spec_method=method,
        spec_method_requested=requested if enabled else None,
        mtp=enabled and method == "mtp",
        num_speculative_tokens=k,
        parallel_drafting=parallel if enabled else False,
        draft_slots_per_request=slots,
    )

    # --- async scheduling -------------------------------------------------------------------
    v["async_scheduling"], sources["async_scheduling"] = _async_scheduling(spec, version, enabled and method in EAGLE_TYPES)

    # --- prefix caching / mamba cache mode --------------------------------------------------
    if spec.prefix_caching is not None:
        prefix: bool | None = spec.prefix_caching
        sources["prefix_caching"] = "spec.prefixCaching"
    elif not gdn:
        prefix = None
        sources["prefix_caching"] = "unset: default depends on the (unrecognised) model family"
    elif version is None:
        prefix = None
        sources["prefix_caching"] = "unset: default unknown for an unparseable vLLM version"
    elif version >= PREFIX_CACHING_HYBRID_DEFAULT_ON:
        prefix = True
        sources["prefix_caching"] = "unset: on by default for hybrid models from vLLM 0.28.0"
    else:
        prefix = False
        sources["prefix_caching"] = "unset: off by default for hybrid models up to vLLM 0.27.1 (opt-in)"
    v["prefix_caching"] = prefix

    mamba: str | None = None
    if gdn:
        if prefix is not None:
            mamba = "align" if prefix else "none"
            sources["mamba_cache_mode"] = f"follows prefix caching ({_on(prefix)})"
        if ov.mamba_cache_mode is not None:
            if version is not None and version >= MAMBA_MODE_FLAG_NOOP_FROM:
                notes.append(
                    f"--mamba-cache-mode {ov.mamba_cache_mode} is a deprecated no-op in vLLM 0.33.0; "
                    "mamba prefix caching follows --enable-prefix-caching"
                )
            else:
                mamba = ov.mamba_cache_mode
                sources["mamba_cache_mode"] = "--mamba-cache-mode"
    v["mamba_cache_mode"] = mamba

    # --- chunked prefill --------------------------------------------------------------------
    if spec.chunked_prefill is not None:
        v["chunked_prefill"] = spec.chunked_prefill
        sources["chunked_prefill"] = "spec.chunkedPrefill"
    else:
        v["chunked_prefill"] = True
        sources["chunked_prefill"] = "unset: on by default (vLLM V1)"

    # --- model runner -----------------------------------------------------------------------
    env_raw: str | None
    if "VLLM_USE_V2_MODEL_RUNNER" in ov.env:
        env_raw = ov.env["VLLM_USE_V2_MODEL_RUNNER"]
        env_src = "VLLM_USE_V2_MODEL_RUNNER"
    elif spec.model_runner == "v2":
        env_raw, env_src = "1", "spec.modelRunner: v2 (VLLM_USE_V2_MODEL_RUNNER=1)"
    elif spec.model_runner == "v1":
        env_raw, env_src = "0", "spec.modelRunner: v1 (VLLM_USE_V2_MODEL_RUNNER=0)"
    else:
        env_raw, env_src = None, ""
    env_valid = True
    forced: bool | None = None
    if env_raw is not None:
        try:
            forced = bool(int(env_raw.strip()))  # vLLM: bool(int(value)) in every catalogued release
        except ValueError:
            env_valid = False
    v["v2_runner_env"] = env_raw
    v["v2_runner_env_valid"] = env_valid
    if forced is not None:
        runner: str | None = "v2" if forced else "v1"
        sources["model_runner"] = f"{env_src}={env_raw}" if env_src == "VLLM_USE_V2_MODEL_RUNNER" else env_src
    elif not env_valid:
        runner = None
        sources["model_runner"] = f"VLLM_USE_V2_MODEL_RUNNER={env_raw!r} is not an integer"
    elif version is None:
        runner = None
        sources["model_runner"] = "auto: unknown for an unparseable vLLM version"
    elif not gdn:
        runner = None
        sources["model_runner"] = "auto: depends on the (unrecognised) model family"
    elif version >= V1_RUNNER_REMOVED_IN:
        runner = "v2"
        sources["model_runner"] = "auto: V2 is the only runner from vLLM 0.34.0 (V1 removed)"
    elif version >= V2_RUNNER_DEFAULT_FROM:
        runner = "v2"
        sources["model_runner"] = "auto: V2 is the default runner from vLLM 0.29.0"
        notes.append("V2 runner assumed (vLLM 0.29.0+ default); vLLM falls back to V1 for features V2 lacks")
    else:
        runner = "v1"
        sources["model_runner"] = "auto: V1 is the default runner for hybrid models up to vLLM 0.28.0"
    v["model_runner"] = runner

    # --- full-attention KV-cache groups (G1's trigger, rules/layout.py) ---------------------
    v["attention_kv_groups"], sources["attention_kv_groups"] = _attention_kv_groups(
        spec.model.uri if gdn else None, method if enabled else None, version
    )

    # --- parallelism, batching --------------------------------------------------------------
    v["tensor_parallel_size"] = spec.tensor_parallel_size  # per engine group: a multi-node group shares one TP world
    v["pipeline_parallel_size"] = spec.pipeline_parallel_size
    v["nodes"] = spec.nodes
    v["shutdown_timeout"] = spec.shutdown_timeout_seconds or 0  # explicit only (the autoscaling default is version-gated)
    v["max_model_len"] = spec.max_model_len
    mns = spec.max_num_seqs if spec.max_num_seqs is not None else DEFAULT_MAX_NUM_SEQS
    if spec.max_num_batched_tokens is not None:
        mnbt = spec.max_num_batched_tokens
        sources["max_num_batched_tokens"] = "spec.maxNumBatchedTokens"
    else:
        mnbt = DEFAULT_MAX_NUM_BATCHED_TOKENS
        if v["chunked_prefill"] is False and spec.max_model_len is not None:
            mnbt = max(mnbt, spec.max_model_len)
        sources["max_num_batched_tokens"] = f"unset: assumed vLLM server default {mnbt}"
    sources["max_num_seqs"] = (
        "spec.maxNumSeqs" if spec.max_num_seqs is not None else (f"unset: assumed vLLM server default {DEFAULT_MAX_NUM_SEQS}")
    )
    v["max_num_seqs"] = mns
    v["max_num_batched_tokens"] = mnbt
    v["scheduled_token_budget"] = mnbt - slots * mns if enabled else None

    # --- kernels ----------------------------------------------------------------------------
    v["attention_backend"] = spec.attention_backend or "auto"
    v["gdn_prefill_backend"] = spec.gdn_prefill_backend or "auto"
    sources["gdn_prefill_backend"] = (
        "spec.gdnPrefillBackend"
        if spec.gdn_prefill_backend
        else ("unset: vLLM auto-selects (FlashInfer on some GPUs, Triton/FLA on others)")
    )
    v["enforce_eager"] = spec.enforce_eager
    v["cudagraph_mode"] = "NONE" if spec.enforce_eager else (spec.cudagraph_mode or "auto")
    v["cudagraph_implementation_set"], v["cudagraph_implementation"], sources["cudagraph_implementation"] = (
        _cudagraph_implementation(spec, ov, arch, version)
    )

    # --- image, env, extra args -------------------------------------------------------------
    v["patches"] = frozenset(spec.image.patches)
    for e in spec.env:
        v["env." + e.name] = e.value if e.value is not None else "<from secret>"
    for name, value in ov.env.items():
        v["env." + name] = value
    # the full option strings vLLM's parser resolves extraArgs to (abbreviations, aliases, --x_y spelled out)
    v["extra_args_flags"] = (
        resolve_extra_args(spec.extra_args, raw_version).flags if spec.extra_args else frozenset()
    ) | frozenset(ov.extra_flags)
    return Effective(version, v, sources, notes)


def _async_scheduling(spec: GDNModelServerSpec, version: Version | None, eagle_type: bool) -> tuple[bool | None, str]:
    """(async scheduling on, why) for `spec` at `version`; None: vLLM's default is not catalogued."""
    if spec.async_scheduling is not None:
        return spec.async_scheduling, "spec.asyncScheduling"
    if version is not None and version >= ASYNC_ON_FOR_ALL_FROM:
        return True, "unset: vLLM turns async scheduling on for every generative model from 0.34.0"
    if eagle_type:
        return True, "unset: vLLM turns async scheduling on with EAGLE/MTP speculative decoding"
    return None, "unset: vLLM default (not catalogued without EAGLE/MTP)"


def _cudagraph_implementation(
    spec: GDNModelServerSpec, ov: LaunchOverrides, arch: str | None, version: Version | None
) -> tuple[str | None, str | None, str]:
    """(what the spec or launch line sets, what vLLM runs, why) for the piecewise CUDA-graph capture: None when
    no graphs are captured or the release is unknown."""
    if spec.cudagraph_implementation is not None:
        chosen = CudagraphImplementation(spec.cudagraph_implementation).value
        return chosen, chosen, "spec.cudagraphImplementation"
    if "VLLM_USE_BREAKABLE_CUDAGRAPH" in ov.env:  # vLLM (envs.py) reads it as == "1"
        chosen = "breakable" if ov.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1" else "compiled"
        return chosen, chosen, f"VLLM_USE_BREAKABLE_CUDAGRAPH={ov.env['VLLM_USE_BREAKABLE_CUDAGRAPH']}"
    if spec.enforce_eager:
        return None, None, "enforceEager: no CUDA graphs"
    if version is None:
        return None, None, "unset: unknown for an unparseable vLLM version"
    if version >= BREAKABLE_QWEN3_5_DEFAULT_FROM and arch in BREAKABLE_DEFAULT_ARCHITECTURES:
        return None, "breakable", "unset: vLLM 0.34.0+ picks breakable CUDA graphs for Qwen3.5 classes on NVIDIA"
    return None, "compiled", "unset: torch.compile piecewise graphs (vLLM's default for this model and release)"


def describe_field(eff: Effective, path: str) -> str:
    """A short human phrase for what the spec path resolves to, e.g. for rule messages (remembered in `eff`:
    a resolved configuration is never changed)."""
    phrase = eff.described.get(path)
    if phrase is None:
        phrase = eff.described[path] = _describe(eff, path)
    return phrase


def _describe(eff: Effective, path: str) -> str:
    v = eff.values
    src = eff.sources
    if path == "spec.image.vllmVersion":
        return f"vLLM {v['vllm_version']}"
    if path.startswith("spec.speculativeDecoding"):
        if not v["spec_enabled"]:
            return "speculative decoding off"
        req = v["spec_method_requested"]
        alias = f" (requested as {req})" if req and req != v["spec_method"] else ""
        return f"speculative method {v['spec_method']}{alias} k={v['num_speculative_tokens']}"
    if path == "spec.asyncScheduling":
        return f"async scheduling {_on(v['async_scheduling'])} ({src.get('async_scheduling', '')})"
    if path == "spec.prefixCaching":
        mode = f", mamba cache mode {v['mamba_cache_mode']}" if v["mamba_cache_mode"] else ""
        return f"prefix caching {_on(v['prefix_caching'])} ({src.get('prefix_caching', '')}{mode})"
    if path == "spec.chunkedPrefill":
        return f"chunked prefill {_on(v['chunked_prefill'])} ({src.get('chunked_prefill', '')})"
    if path == "spec.modelRunner":
        runner = (v["model_runner"] or "unknown").upper()
        return f"{runner} model runner ({src.get('model_runner', '')})"
    if path == "spec.tensorParallelSize":
        return f"tensor parallel size {v['tensor_parallel_size']}"
    if path in ("spec.nodes", "spec.pipelineParallelSize"):
        return f"{v['nodes']} node(s) per engine, pipeline parallel size {v['pipeline_parallel_size']}"
    if path == "spec.shutdownTimeoutSeconds":
        return f"shutdown timeout {v['shutdown_timeout']}s"
    if path == "spec.attentionBackend":
        return f"attention backend {v['attention_backend']}"
    if path == "spec.gdnPrefillBackend":
        return f"GDN prefill backend {v['gdn_prefill_backend']}"
    if path in ("spec.maxNumBatchedTokens", "spec.maxNumSeqs"):
        return (
            f"scheduled-token budget {v['max_num_batched_tokens']} - {v['draft_slots_per_request']} draft slots x "
            f"{v['max_num_seqs']} seqs = {v['scheduled_token_budget']}"
        )
    if path == "spec.maxModelLen":
        return f"max model len {v['max_model_len'] if v['max_model_len'] is not None else 'unset (model default)'}"
    if path == "spec.model.architecture":
        return f"architecture {v['architecture'] or 'unrecognised'}"
    if path.startswith("spec.env"):
        # names only: env values can be credentials, and findings are copied into status and Events
        envs = ", ".join(sorted(k[4:] for k in v if k.startswith("env.")))  # the same order as the full keys
        return f"env {envs} set" if envs else ""
    if path == "spec.model.uri":
        n = v["attention_kv_groups"]
        what = "unknown" if n is None else str(n)
        return f"full-attention KV-cache groups {what} ({src.get('attention_kv_groups', '')})"
    if path == "spec.cudagraphMode":
        return f"cudagraph mode {v['cudagraph_mode']}"
    if path == "spec.cudagraphImplementation":
        impl = v["cudagraph_implementation"] or "none"
        return f"CUDA-graph implementation {impl} ({src.get('cudagraph_implementation', '')})"
    return path
