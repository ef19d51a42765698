"""GDNModelServer API (serving.gdn-operator.io/v1alpha1).

These pydantic models are the single source of truth: the CRD's OpenAPI schema is generated from them
(`gdnctl crd`, see api/crd.py), the webhook and the reconciler validate with them, and gdnctl reads
manifests with them. Field names follow Kubernetes API conventions (camelCase in YAML/JSON).
"""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gdn_operator.api import k8s as _k8s
from gdn_operator.api import vllm_args as _vllm_args
from gdn_operator.api.base import _Model, _Status
from gdn_operator.api.probes import ProbesSpec, ProbesStatus
from gdn_operator.api.scaleout import AutoscalingSpec, RouterSpec


# --------------------------------------------------------------------------------------- enums ---


class Architecture(str, enum.Enum):
    """HF `architectures` classes of the Gated DeltaNet hybrid families vLLM serves (Qwen3.6 and
    Qwen3.8 checkpoints load as the Qwen3_5 classes)."""

    QWEN3_NEXT = "Qwen3NextForCausalLM"
    QWEN3_5 = "Qwen3_5ForConditionalGeneration"
    QWEN3_5_CAUSAL = "Qwen3_5ForCausalLM"
    QWEN3_5_MOE = "Qwen3_5MoeForConditionalGeneration"
    QWEN3_5_MOE_CAUSAL = "Qwen3_5MoeForCausalLM"


class PullPolicy(str, enum.Enum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class SpecMethod(str, enum.Enum):
    """`mtp`, plus the deprecated aliases vLLM still accepts and rewrites to `mtp`."""

    MTP = "mtp"
    QWEN3_NEXT_MTP = "qwen3_next_mtp"
    QWEN3_5_MTP = "qwen3_5_mtp"


class ModelRunner(str, enum.Enum):
    AUTO = "auto"
    V1 = "v1"
    V2 = "v2"


class AttentionBackend(str, enum.Enum):
    FLASH_ATTN = "FLASH_ATTN"
    FLASHINFER = "FLASHINFER"
    TRITON_ATTN = "TRITON_ATTN"
    FLEX_ATTENTION = "FLEX_ATTENTION"
    TREE_ATTN = "TREE_ATTN"
    ROCM_ATTN = "ROCM_ATTN"
    CPU_ATTN = "CPU_ATTN"


class GDNPrefillBackend(str, enum.Enum):
    FLASHINFER = "flashinfer"
    TRITON = "triton"
    CUTEDSL = "cutedsl"
    AITER_FLYDSL = "aiter_flydsl"
    SYCL = "sycl"


class CudagraphMode(str, enum.Enum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


class AdmissionPolicy(str, enum.Enum):
    REJECT = "reject"
    MITIGATE = "mitigate"
    WARN = "warn"


class RemediationMode(str, enum.Enum):
    AUTO = "auto"
    NONE = "none"


class Phase(str, enum.Enum):
    PENDING = "Pending"
    REJECTED = "Rejected"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    CRASH_LOOPING = "CrashLooping"
    UNSCHEDULABLE = "Unschedulable"


# ------------------------------------------------------------------------------------ spec parts ---

#: Environment variables the operator sets itself. What extraArgs / env may not set is data:
#: api/data/extra-args-policy.yaml, applied by api/vllm_args.py with the target release's option table.
OPERATOR_OWNED_ENV = frozenset(_vllm_args.policy()["env"]["owned"])
#: Bounds on one spec (a webhook answers 4xx for larger or deeper input; the schema needs depth < 12).
MAX_SPEC_DEPTH = 32
MAX_SPEC_BYTES = 512 * 1024
#: Environment the LeaderWorkerSet controller injects into multi-node engine pods (render/lws.py reads it).
LWS_ENV = frozenset(_vllm_args.policy()["env"]["injected"])

_MODEL_URI = re.compile(r"^(hf|pvc|s3|gs|oci|file)://\S+$")


class SecretKeyRef(_Model):
    """A key in a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key inside the Secret.")

    @field_validator("name")
    @classmethod
    def _secret_name(cls, v: str) -> str:
        if not _k8s.dns1123_subdomain(v):
            raise ValueError(f"{v!r} is not a valid Secret name (lowercase letters, digits, '-' and '.')")
        return v

    @field_validator("key")
    @classmethod
    def _secret_key(cls, v: str) -> str:
        if not _k8s.SECRET_KEY.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid Secret key (letters, digits, '-', '_' and '.')")
        return v


class ModelSpec(_Model):
    """What to serve."""

    uri: str = Field(
        description=(
            "Model source: hf://ORG/NAME (downloaded by vLLM), pvc://CLAIM/PATH (a pre-populated "
            "PersistentVolumeClaim mounted read-only), or s3://, gs://, oci://, file:// URIs."
        ),
        max_length=1024,
        json_schema_extra={"pattern": _MODEL_URI.pattern},
    )
    served_name: str | None = Field(
        default=None, max_length=256, description="Name clients use in the OpenAI API (default: the GDNModelServer's name)."
    )
    architecture: Architecture | None = Field(
        default=None,
        description=(
            "HF architecture class of the checkpoint. The rules match on the class, not the marketing "
            "name; when unset it is inferred from the model name (Qwen3-Next / Qwen3.5 / Qwen3.6 / Qwen3.8)."
        ),
    )
    hf_token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token, passed to the engine as HF_TOKEN."
    )

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        if not _MODEL_URI.fullmatch(v):
            raise ValueError("must look like hf://ORG/NAME or pvc://CLAIM/PATH (also s3://, gs://, oci://, file://)")
        if v.startswith("pvc://"):
            claim = v[len("pvc://") :].split("/", 1)[0]
            if not _k8s.dns1123_subdomain(claim):
                raise ValueError(f"pvc:// claim name {claim!r} is not a valid Kubernetes name")
        return v

    @property
    def pvc_claim(self) -> str | None:
        if self.uri.startswith("pvc://"):
            return self.uri[len("pvc://") :].split("/", 1)[0]
        return None

    @property
    def pvc_subpath(self) -> str:
        if self.uri.startswith("pvc://"):
            parts = self.uri[len("pvc://") :].split("/", 1)
            return parts[1].strip("/") if len(parts) > 1 else ""
        return ""

    @property
    def name_for_inference(self) -> str:
        """The path part of the URI, for inferring the family from a marketing name."""
        return self.uri.split("://", 1)[-1]


class ImageSpec(_Model):
    """The vLLM image and what it is known to contain."""

    repository: str = Field(default="vllm/vllm-openai", min_length=1, max_length=512, description="Image repository.")
    tag: str = Field(min_length=1, max_length=128, description="Image tag (or digest with 'sha256:').")
    pull_policy: PullPolicy = Field(default=PullPolicy.IF_NOT_PRESENT, description="Image pull policy.")
    vllm_version: str = Field(
        min_length=1,
        max_length=64,
        description=(
            "vLLM release inside the image (e.g. 0.33.0). The known-crash rules are evaluated against it; "
            "an unparseable version is reported as a finding."
        ),
    )
    patches: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Patch ids the image carries (e.g. the gdn-guard plugin's ids). A rule listing one of them "
            "as a neutraliser does not fire. The operator compares this with what the plugin logs at start."
        ),
    )

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _k8s.IMAGE_REPOSITORY.fullmatch(v):
            raise ValueError(f"{v!r} is not an image repository (e.g. ghcr.io/org/vllm-gdn, vllm/vllm-openai)")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str) -> str:
        if not _k8s.IMAGE_TAG.fullmatch(v):
            raise ValueError(f"{v!r} is not an image tag (letters, digits, '_', '.', '-', '+'; or sha256:<64 hex>)")
        return v

    @field_validator("vllm_version")
    @classmethod
    def _version_text(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_!-]*", v):
            raise ValueError(f"{v!r} is not a version string (e.g. 0.33.0; no spaces or line breaks)")
        return v

    @property
    def reference(self) -> str:
        if self.tag.startswith("sha256:"):
            return f"{self.repository}@{self.tag}"
        return f"{self.repository}:{self.tag}"


class SpeculativeDecodingSpec(_Model):
    """MTP speculative decoding."""

    enabled: bool = Field(default=True, description="Turn speculative decoding on (MTP draft head).")
    method: SpecMethod = Field(
        default=SpecMethod.MTP,
        description="Speculative method; qwen3_next_mtp and qwen3_5_mtp are deprecated aliases of mtp.",
    )
    num_speculative_tokens: int = Field(default=2, ge=1, le=16, description="Draft tokens per step (k).")


class EnvVar(_Model):
    """An environment variable for the engine container (value or a Secret reference)."""

    name: str = Field(min_length=1, max_length=256, json_schema_extra={"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"})
    value: str | None = Field(default=None, max_length=32768)
    secret_key_ref: SecretKeyRef | None = Field(default=None, description="Take the value from a Secret key.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _k8s.ENV_NAME.fullmatch(v):
            raise ValueError("must be a valid environment variable name")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVar":
        if self.value is not None and self.secret_key_ref is not None:
            raise ValueError("set either value or secretKeyRef, not both")
        return self


class ResourcesSpec(_Model):
    """Compute for one engine pod. GPUs are always tensorParallelSize."""

    gpu_type: str | None = Field(
        default=None,
        max_length=63,
        description="GPU product (node label nvidia.com/gpu.product), e.g. NVIDIA-H100-80GB-HBM3.",
        json_schema_extra={"pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"},
    )

    @field_validator("gpu_type")
    @classmethod
    def _label_value(cls, v: str | None) -> str | None:
        if v is not None and not _k8s.label_value(v):
            raise ValueError(f"{v!r} is not a valid label value (the node label nvidia.com/gpu.product uses '-' for spaces, e.g. NVIDIA-H100-80GB-HBM3)")
        return v
    cpu: str = Field(default="8", max_length=32, description="CPU request and limit per engine pod.")
    memory: str = Field(default="64Gi", max_length=32, description="Memory request and limit per engine pod.")
    shm_size: str = Field(default="16Gi", max_length=32, description="Size of the memory-backed /dev/shm.")
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "GPUs each engine pod requests (one pod per node). Default tensorParallelSize x pipelineParallelSize / "
            "nodes; when set it must equal that (GPUs per node x nodes = TP x PP)."
        ),
    )

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not _k8s.positive_quantity(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity above zero (e.g. 8, 500m, 64Gi)")
        return v


class RemediationSpec(_Model):
    """What the crash watch does when a known crash signature repeats."""

    mode: RemediationMode = Field(
        default=RemediationMode.AUTO,
        description=(
            "auto: after `threshold` crashes with the same known signature on one generation, apply the "
            "documented workaround once and record it; none: only report."
        ),
    )
    threshold: int = Field(default=3, ge=1, le=100, description="Crashes with one signature before remediating.")


class MetricsSpec(_Model):
    """Scraping the engines' /metrics for speculative-decoding acceptance."""

    enabled: bool = Field(default=True, description="Scrape engine pods and report acceptance.")
    scrape_interval_seconds: int = Field(default=15, ge=5, le=3600, description="Scrape interval.")


def _drop_schema_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class GDNModelServerSpec(_Model):
    """Desired state of a GDNModelServer."""

    model: ModelSpec
    image: ImageSpec
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Engine replicas (one pod each, or one group of `nodes` pods). Default 1; leave unset with autoscaling.",
        # no schema default: the API server must not store replicas for an autoscaled server (mutually exclusive)
        json_schema_extra=_drop_schema_default,
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs per engine (vLLM -tp).")
    pipeline_parallel_size: int = Field(
        default=1, ge=1, le=64, description="Pipeline stages per engine (vLLM --pipeline-parallel-size)."
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Nodes one engine spans (vLLM --nnodes, multiprocessing launcher). Above 1 the engine runs as a "
            "LeaderWorkerSet group: the leader serves the API, the other nodes run headless. "
            "tensorParallelSize x pipelineParallelSize must divide evenly by nodes."
        ),
    )
    speculative_decoding: SpeculativeDecodingSpec = Field(
        default_factory=SpeculativeDecodingSpec, description="MTP speculative decoding."
    )
    max_model_len: int | None = Field(default=None, ge=16, le=10_000_000, description="vLLM --max-model-len.")
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536, description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=10_000_000, description="vLLM --max-num-batched-tokens."
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=0.99, description="vLLM --gpu-memory-utilization.")
    async_scheduling: bool | None = Field(
        default=None, description="vLLM async scheduling; unset = vLLM's default (on with MTP)."
    )
    prefix_caching: bool | None = Field(
        default=None, description="vLLM prefix caching; unset = vLLM's default (on for hybrids from 0.26.0)."
    )
    chunked_prefill: bool | None = Field(default=None, description="vLLM chunked prefill; unset = vLLM's default.")
    model_runner: ModelRunner = Field(
        default=ModelRunner.AUTO, description="auto (vLLM decides), v1 or v2 (VLLM_USE_V2_MODEL_RUNNER)."
    )
    attention_backend: AttentionBackend | None = Field(default=None, description="vLLM --attention-backend.")
    gdn_prefill_backend: GDNPrefillBackend | None = Field(
        default=None, description="vLLM --gdn-prefill-backend (from 0.18.0)."
    )
    cudagraph_mode: CudagraphMode | None = Field(
        default=None, description="CUDA graph mode (--compilation-config cudagraph_mode)."
    )
    enforce_eager: bool = Field(default=False, description="vLLM --enforce-eager (no CUDA graphs).")
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=128,
        description=(
            "Extra vLLM arguments, resolved with the option table of spec.image.vllmVersion the way vLLM's "
            "parser reads them (abbreviations, aliases, dotted JSON keys): options the operator renders "
            "or the known-crash rules read, unknown options and --config are refused."
        ),
    )
    allow_unsafe_env: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Explicit opt-in for env names that change which code the interpreter or dynamic loader runs "
            "(LD_PRELOAD, LD_LIBRARY_PATH, PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PATH, ...), which are "
            "refused otherwise. Owned and rule-relevant VLLM_* variables cannot be opted in."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra engine environment (see allowUnsafeEnv; variables the operator owns are refused).",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per-pod compute.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector for engine pods.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations for engine pods.")
    affinity: dict[str, Any] | None = Field(default=None, description="Affinity for engine pods.")
    startup_budget_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="How long an engine may take to load before its startup probe fails (default 30 min).",
    )
    admission_policy: AdmissionPolicy | None = Field(
        default=None,
        description=(
            "What to do with a known-crash finding: reject, mitigate (apply the rule's mitigation) or warn. "
            "Unset = the operator-wide default. Silent-corruption rules never just warn."
        ),
    )
    remediation: RemediationSpec = Field(default_factory=RemediationSpec, description="Crash-loop remediation.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Acceptance scraping.")
    probes: ProbesSpec | None = Field(
        default=None,
        description="Output probes: known-answer requests to every Ready engine to catch silent corruption (off when unset).",
    )
    shutdown_timeout_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Seconds vLLM lets in-flight requests finish on SIGTERM (--shutdown-timeout, vLLM 0.18.0+) during "
            "scale-down and rollouts. Unset: 30 with autoscaling on vLLM 0.18.0+, else vLLM's default (abort)."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Scale replicas on vLLM load (KEDA or HPA). Mutually exclusive with replicas."
    )
    router: RouterSpec | None = Field(default=None, description="LLM-aware routing (Gateway API Inference Extension).")

    @model_validator(mode="before")
    @classmethod
    def _replicas_or_autoscaling(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("autoscaling") is not None and data.get("replicas") is not None:
            raise ValueError(
                "replicas and autoscaling are mutually exclusive: the autoscaler owns the replica count; "
                "remove spec.replicas (or spec.autoscaling)"
            )
        return data

    @field_validator("nodes")
    @classmethod
    def _nodes_divide(cls, v: int, info: Any) -> int:
        tp, pp = info.data.get("tensor_parallel_size"), info.data.get("pipeline_parallel_size")
        if tp is None or pp is None:
            return v  # reported on their own fields
        world = tp * pp
        if world % v:
            fits = [n for n in range(1, world + 1) if world % n == 0]
            raise ValueError(
                f"{v} nodes cannot split tensorParallelSize x pipelineParallelSize = {tp} x {pp} = {world} GPUs evenly "
                f"(vLLM needs the same GPU count on every node); use nodes in {fits} or change the parallel sizes"
            )
        return v

    @field_validator("resources")
    @classmethod
    def _gpus_per_node(cls, v: "ResourcesSpec", info: Any) -> "ResourcesSpec":
        tp, pp, nodes = (info.data.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "nodes"))
        if v.gpus_per_node is None or None in (tp, pp, nodes):
            return v
        if v.gpus_per_node * nodes != tp * pp:
            raise ValueError(
                f"gpusPerNode {v.gpus_per_node} x nodes {nodes} = {v.gpus_per_node * nodes} GPUs, but tensorParallelSize x "
                f"pipelineParallelSize = {tp} x {pp} = {tp * pp}; GPUs per node x nodes must equal TP x PP "
                f"(e.g. nodes {max(1, (tp * pp) // v.gpus_per_node)} with {v.gpus_per_node} GPUs per node"
                + ("" if (tp * pp) % v.gpus_per_node == 0 else ", after changing the parallel sizes") + ")"
            )
        return v

    @property
    def gpus_per_pod(self) -> int:
        """GPUs one engine pod requests: TP x PP spread evenly over the nodes."""
        return (self.tensor_parallel_size * self.pipeline_parallel_size) // self.nodes

    @field_validator("extra_args")
    @classmethod
    def _extra_args_resolved(cls, v: list[str], info: ValidationInfo) -> list[str]:
        image = info.data.get("image")
        if image is None or not v:
            return v  # an invalid image is reported on its own field
        problems = _vllm_args.resolve_extra_args(v, image.vllm_version).problems
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _k8s.label_key(key):
                raise ValueError(f"key {key!r} is not a valid label key")
            if not _k8s.label_value(value):
                raise ValueError(f"value {value!r} of {key!r} is not a valid label value")
        return v

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not v:
            return v
        # imported here: `gdnctl render` runs on GPU hosts with only the offline vLLM bundle (no k8s client)
        from kubernetes.client import V1Toleration

        for i, t in enumerate(v):
            problems = _k8s.check_k8s(V1Toleration, t, f"tolerations[{i}]") or _k8s.toleration_problems(t, f"tolerations[{i}]")
            if problems:
                raise ValueError("; ".join(problems))
        return v

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            from kubernetes.client import V1Affinity  # see _tolerations

            problems = _k8s.check_k8s(V1Affinity, v, "affinity") or _k8s.affinity_problems(v)
            if problems:
                raise ValueError("; ".join(problems))
        return v

    @field_validator("env")
    @classmethod
    def _env_policy(cls, v: list[EnvVar], info: ValidationInfo) -> list[EnvVar]:
        allowed = info.data.get("allow_unsafe_env") or []
        seen: set[str] = set()
        for i, e in enumerate(v):
            why = _vllm_args.env_refusal(e.name, allowed)
            if why:
                raise ValueError(f"env[{i}] {why}")
            if e.name in seen:
                raise ValueError(f"env[{i}] {e.name!r} is set twice")
            seen.add(e.name)
        return v

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        """Bounded nesting and size before anything walks the input recursively (webhook 4xx, not 5xx)."""
        if not isinstance(data, dict):
            return data
        where = _k8s.too_deep(data, MAX_SPEC_DEPTH)
        if where is not None:
            top = where.split(".")[0].split("[")[0]
            raise ValueError(f"spec.{top} nests deeper than {MAX_SPEC_DEPTH} levels (at spec.{where[:160]}); "
                             "no GDNModelServer field needs that")
        size = len(json.dumps(data, default=str))
        if size > MAX_SPEC_BYTES:
            sizes = {k: len(json.dumps(v, default=str)) for k, v in data.items()}
            biggest = max(sizes, key=lambda k: sizes[k])
            raise ValueError(f"the spec is {size // 1024} KiB of JSON, more than the {MAX_SPEC_BYTES // 1024} KiB limit; "
                             f"the largest field is spec.{biggest} ({sizes[biggest] // 1024} KiB)")
        return data

    @model_validator(mode="after")
    def _consistency(self) -> "GDNModelServerSpec":
        if self.cudagraph_mode is not None and self.cudagraph_mode != CudagraphMode.NONE.value and self.enforce_eager:
            raise ValueError("enforceEager: true disables CUDA graphs; drop cudagraphMode or enforceEager")
        return self


# ---------------------------------------------------------------------------------------- status ---


class Condition(_Status):
    type: str = Field(description="Validated, Ready, Progressing, Degraded, CrashLooping, Unschedulable, ...")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")
    observed_generation: int | None = None


class Finding(_Status):
    """One known-issue rule that matched the effective configuration."""

    rule: str = Field(description="Rule id = upstream reference, e.g. vllm#36917.")
    title: str = ""
    kind: str = Field(default="", description="startup-crash, runtime-crash, silent-corruption, deadlock, config.")
    severity: str = Field(default="", description="critical, high, medium, low, info.")
    action: str = Field(default="", description="What admission did: rejected, mitigated, warned.")
    message: str = ""
    fields: list[str] = Field(default_factory=list, description="Spec fields that trigger the rule.")
    workaround: str = ""
    mitigation: dict[str, Any] | None = Field(default=None, description="Spec change the rule applies when mitigating.")


class CrashInfo(_Status):
    """The most recent engine crash the crash watch classified."""

    time: str | None = None
    pod: str | None = None
    container: str | None = None
    group: str | None = Field(default=None, description="Multi-node engines: the LeaderWorkerSet group (<name>/<index>).")
    incident_pods: list[str] = Field(
        default_factory=list, max_length=16, description="Multi-node engines: the group's pods that died in this one crash."
    )
    signature: str = Field(description="Signature id from the catalogue, or engine-dead for an unknown crash.")
    upstream: str | None = Field(default=None, description="Upstream issue, e.g. vllm#36917.")
    kind: str | None = None
    root_cause: str | None = Field(default=None, description="The root-cause line extracted from the log.")
    exit_code: int | None = None
    restart_count: int | None = None
    count: int | None = Field(default=None, description="Crashes with this signature on this generation.")
    generation: int | None = Field(default=None, description="Spec generation the crashes were counted on.")
    remediation_hint: str | None = Field(default=None, description="What the catalogue says to do about it.")


class Remediation(_Status):
    """A change the operator made to stop a deterministic crash loop."""

    time: str | None = None
    signature: str
    upstream: str | None = None
    generation: int | None = Field(default=None, description="Spec generation the remediation was applied on.")
    action: str = Field(description="What was changed, e.g. asyncScheduling=false.")
    changes: dict[str, Any] = Field(default_factory=dict, description="Spec fields changed (camelCase path → value).")
    reason: str = ""


class PodAcceptance(_Status):
    pod: str
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    drafts_per_second: float | None = None
    error: str | None = Field(default=None, description="Last scrape error: timeout, connect, http, parse.")


class AcceptanceFinding(_Status):
    reason: str = Field(description="SpecAcceptanceNearZero, SpecAcceptanceDrop, EarlyStopShift, ...")
    severity: str = "Warning"
    message: str = ""
    upstream: list[str] = Field(default_factory=list)
    pods: list[str] = Field(default_factory=list)


class AcceptanceStatus(_Status):
    """Speculative-decoding acceptance over the scrape window (from the engines' /metrics)."""

    state: str | None = Field(
        default=None, description="NoData, WarmingUp, NotApplicable (spec decode off), NoTraffic, Ok, Degraded."
    )
    rate: float | None = Field(default=None, description="Accepted / draft tokens over the window.")
    rate_display: str | None = Field(default=None, description="Rate as a percentage string, for kubectl.")
    mean_accepted_length: float | None = Field(default=None, description="1 + accepted / drafts.")
    per_position: list[float | None] = Field(default_factory=list, description="Acceptance per draft position.")
    drafts_per_second: float | None = None
    window_seconds: float | None = None
    observed_seconds: float | None = None
    baseline_rate: float | None = Field(default=None, description="Healthy acceptance the drop check compares with.")
    stop_share: float | None = Field(default=None, description="Share of finished requests that stopped on EOS/stop.")
    mean_generation_length: float | None = None
    pods_reporting: int | None = None
    scrape_errors: int | None = None
    updated: str | None = None
    findings: list[AcceptanceFinding] = Field(default_factory=list, max_length=16)
    pods: list[PodAcceptance] = Field(default_factory=list, max_length=64, description="Per pod (first 64).")


class EffectiveConfig(_Status):
    """vLLM's behaviour after resolving its version-dependent defaults (what the rules evaluated)."""

    vllm_version: str | None = None
    async_scheduling: bool | None = None
    prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    model_runner: str | None = None
    spec_method: str | None = None
    architecture: str | None = None


class GDNModelServerStatus(_Status):
    phase: Phase | None = None
    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    ready: str | None = Field(default=None, description="ready/desired, for kubectl.")
    workload: str | None = Field(default=None, description="Engine workload kind: Deployment or LeaderWorkerSet (multi-node).")
    group_size: int | None = Field(
        default=None, description="Pods per engine group (multi-node); replicas and readyReplicas then count groups."
    )
    conditions: list[Condition] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="Known-issue rules that matched.")
    effective: EffectiveConfig | None = None
    last_crash: CrashInfo | None = None
    remediations: list[Remediation] = Field(default_factory=list, max_length=32)
    acceptance: AcceptanceStatus | None = None
    probes: ProbesStatus | None = None


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class GDNModelServer(_Model):
    """A Qwen3.5-family (Gated DeltaNet hybrid) model served by vLLM with MTP, guarded against known crashes."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=True)

    # the defaults spell the Literal types out (mypy checks they match); = gdn_operator.API_VERSION, KIND
    api_version: Literal["serving.gdn-operator.io/v1alpha1"] = Field(default="serving.gdn-operator.io/v1alpha1")
    kind: Literal["GDNModelServer"] = Field(default="GDNModelServer")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GDNModelServerSpec
    status: GDNModelServerStatus | None = None
