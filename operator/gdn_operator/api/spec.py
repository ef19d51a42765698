"""GDNModelServerSpec: the desired state of a GDNModelServer, and the checks that span its parts
(parallel sizes vs nodes and GPUs, extraArgs and env against the target vLLM release, size bounds).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gdn_operator.api import k8s as _k8s
from gdn_operator.api import vllm_args as _vllm_args
from gdn_operator.api.base import _Model, cel
from gdn_operator.api.cache import SHARED_MODES
from gdn_operator.api.enums import (
    AdmissionPolicy,
    AttentionBackend,
    CudagraphImplementation,
    CudagraphMode,
    GDNPrefillBackend,
    ModelRunner,
)
from gdn_operator.api.parts import (
    EnvVar,
    HealthSpec,
    ImageSpec,
    MetricsSpec,
    ModelSpec,
    RemediationSpec,
    ResourcesSpec,
    SecretKeyRef,
    SpeculativeDecodingSpec,
)
from gdn_operator.api.pod import PodSettings
from gdn_operator.api.probes import ProbesSpec
from gdn_operator.api.rollout import DisruptionBudgetSpec, RolloutSpec
from gdn_operator.api.scaleout import AutoscalingSpec, RouterSpec

#: Bounds on one spec (a webhook answers 4xx for larger or deeper input; the schema needs depth < 12).
MAX_SPEC_DEPTH = 32
MAX_SPEC_BYTES = 512 * 1024


#: Fields whose value only their own type checks, apart from `check_consistency` (no field validator reads them
#: through `info.data`, no "before" model validator looks at them; SpeculativeDecodingSpec has no validators): a
#: change to them is validated field by field (api/specpatch.py `SpecPatch.apply_model`, the safe-defaults rounds of
#: the admission hot path). A validator that starts reading one of them takes it out of this set.
INDEPENDENT_FIELDS = frozenset(
    {
        "async_scheduling",
        "prefix_caching",
        "chunked_prefill",
        "model_runner",
        "attention_backend",
        "gdn_prefill_backend",
        "cudagraph_mode",
        "cudagraph_implementation",
        "enforce_eager",
        "speculative_decoding",
    }
)


def _drop_schema_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class GDNModelServerSpec(_Model):
    """Desired state of a GDNModelServer."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.replicas) || !has(self.autoscaling)",
                "replicas and autoscaling are mutually exclusive: the autoscaler owns the replica count; remove spec.replicas",
            ),
            (
                "!has(self.nodes) || ((has(self.tensorParallelSize) ? self.tensorParallelSize : 1) * "
                "(has(self.pipelineParallelSize) ? self.pipelineParallelSize : 1)) % self.nodes == 0",
                "nodes must divide tensorParallelSize x pipelineParallelSize (vLLM needs the same GPU count on every node)",
            ),
            (
                "!has(self.cudagraphMode) || self.cudagraphMode == 'NONE' || !has(self.enforceEager) || !self.enforceEager",
                "enforceEager: true disables CUDA graphs; drop cudagraphMode or enforceEager",
            ),
            (
                "!has(self.resources) || !has(self.resources.gpusPerNode) || self.resources.gpusPerNode * "
                "(has(self.nodes) ? self.nodes : 1) == (has(self.tensorParallelSize) ? self.tensorParallelSize : 1) * "
                "(has(self.pipelineParallelSize) ? self.pipelineParallelSize : 1)",
                "resources.gpusPerNode x nodes must equal tensorParallelSize x pipelineParallelSize",
            ),
            (
                "!has(self.metrics) || !has(self.health) || !has(self.metrics.scrapeIntervalSeconds) || "
                "!has(self.health.stallSeconds) || (has(self.metrics.enabled) && !self.metrics.enabled) || "
                "self.health.stallSeconds >= 2 * self.metrics.scrapeIntervalSeconds",
                "health.stallSeconds must span at least two scrapes (2 x metrics.scrapeIntervalSeconds)",
            ),
            (
                "!has(self.model.cache) || !has(self.model.cache.persistentVolumeClaim) || "
                "self.model.cache.persistentVolumeClaim.accessMode == 'ReadWriteMany' || "
                "((!has(self.replicas) || self.replicas <= 1) && (!has(self.autoscaling) || "
                "self.autoscaling.maxReplicas <= 1) && (!has(self.nodes) || self.nodes <= 1))",
                "a cache claim whose accessMode is not ReadWriteMany cannot serve several replicas or nodes; use "
                "ReadWriteMany or an emptyDir cache",
            ),
        )
    )

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
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=10_000_000, description="vLLM --max-num-batched-tokens.")
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0.0,
        le=0.99,
        description=(
            "vLLM --gpu-memory-utilization; unset = 0.9 up to vLLM 0.33.x, and from 0.34.0 nothing is rendered: vLLM "
            "sizes the KV cache from the memory it measures (extensible KV cache). Set it when something vLLM does "
            "not measure shares the GPU."
        ),
    )
    async_scheduling: bool | None = Field(
        default=None,
        description="vLLM async scheduling; unset = the value the known-issue rules accept for this vLLM version (status.effective.defaults), else vLLM's default (on with MTP).",
    )
    prefix_caching: bool | None = Field(
        default=None,
        description="vLLM prefix caching; unset = the value the rules accept (off with MTP, vllm#43559), else vLLM's default (on for hybrids from 0.28.0).",
    )
    chunked_prefill: bool | None = Field(
        default=None, description="vLLM chunked prefill; unset = the value the rules accept, else vLLM's default."
    )
    model_runner: ModelRunner = Field(
        default=ModelRunner.AUTO, description="auto (vLLM decides), v1 or v2 (VLLM_USE_V2_MODEL_RUNNER)."
    )
    attention_backend: AttentionBackend | None = Field(default=None, description="vLLM --attention-backend.")
    gdn_prefill_backend: GDNPrefillBackend | None = Field(
        default=None,
        description="vLLM --gdn-prefill-backend (from 0.18.0); unset = the value the rules accept, else vLLM's choice.",
    )
    cudagraph_mode: CudagraphMode | None = Field(
        default=None,
        description="CUDA graph mode (--compilation-config cudagraph_mode); unset = the value the rules accept, else vLLM's default.",
    )
    cudagraph_implementation: CudagraphImplementation | None = Field(
        default=None,
        description=(
            "How vLLM captures the piecewise CUDA graphs (VLLM_USE_BREAKABLE_CUDAGRAPH, vLLM 0.30.0+): breakable "
            "(one capture broken at attention and the GDN core, no torch.compile) or compiled (torch.compile's split "
            "graphs); unset = vLLM's choice (breakable for Qwen3.5 checkpoints on NVIDIA from 0.34.0, else compiled)."
        ),
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
    health: HealthSpec = Field(default_factory=HealthSpec, description="Stall detection on the scraped /metrics.")
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
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description=(
            "Ordinary pod settings of every engine pod (pull secrets, service account, runtime/priority class, "
            "labels, annotations, volumes, securityContext). Scheduling: spec.nodeSelector/tolerations/affinity."
        ),
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Secret key holding the API key clients must send (Authorization: Bearer) to /v1/*; the engine "
            "reads it as VLLM_API_KEY, the operator's output probes send it. /health and /metrics stay open."
        ),
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How a new generation replaces the engines.")
    disruption_budget: DisruptionBudgetSpec = Field(
        default_factory=DisruptionBudgetSpec, description="The engine PodDisruptionBudget (node drains)."
    )

    @model_validator(mode="before")
    @classmethod
    def _replicas_or_autoscaling(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("autoscaling") is not None and data.get("replicas") is not None:
            raise ValueError(
                "replicas and autoscaling are mutually exclusive: the autoscaler owns the replica count; "
                "remove spec.replicas (or spec.autoscaling)"
            )
        return data

    @field_validator("health")
    @classmethod
    def _stall_spans_scrapes(cls, v: HealthSpec, info: ValidationInfo) -> HealthSpec:
        metrics = info.data.get("metrics")
        if metrics is not None and metrics.enabled and v.stall_seconds < 2 * metrics.scrape_interval_seconds:
            raise ValueError(
                f"stallSeconds {v.stall_seconds} is shorter than two scrapes (metrics.scrapeIntervalSeconds "
                f"{metrics.scrape_interval_seconds}): the stall detector judges the engine's progress over several "
                f"scrapes; set stallSeconds to at least {2 * metrics.scrape_interval_seconds} or scrape more often"
            )
        return v

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
    def _gpus_per_node(cls, v: ResourcesSpec, info: Any) -> ResourcesSpec:
        tp, pp, nodes = (info.data.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "nodes"))
        if v.gpus_per_node is None or None in (tp, pp, nodes):
            return v
        if v.gpus_per_node * nodes != tp * pp:
            raise ValueError(
                f"gpusPerNode {v.gpus_per_node} x nodes {nodes} = {v.gpus_per_node * nodes} GPUs, but tensorParallelSize x "
                f"pipelineParallelSize = {tp} x {pp} = {tp * pp}; GPUs per node x nodes must equal TP x PP "
                f"(e.g. nodes {max(1, (tp * pp) // v.gpus_per_node)} with {v.gpus_per_node} GPUs per node"
                + ("" if (tp * pp) % v.gpus_per_node == 0 else ", after changing the parallel sizes")
                + ")"
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
        return _k8s.check_labels(v)

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not v:
            return v
        # imported here: `gdnctl render` runs on GPU hosts with only the offline vLLM bundle (no k8s client)
        try:
            from kubernetes.client import V1Toleration
        except ImportError:
            raise ValueError(_k8s.client_missing("spec.tolerations")) from None

        for i, t in enumerate(v):
            problems = _k8s.check_k8s(V1Toleration, t, f"tolerations[{i}]") or _k8s.toleration_problems(t, f"tolerations[{i}]")
            if problems:
                raise ValueError("; ".join(problems))
        return v

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                from kubernetes.client import V1Affinity  # see _tolerations
            except ImportError:
                raise ValueError(_k8s.client_missing("spec.affinity")) from None

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
            raise ValueError(
                f"spec.{top} nests deeper than {MAX_SPEC_DEPTH} levels (at spec.{where[:160]}); "
                "no GDNModelServer field needs that"
            )
        size = len(json.dumps(data, default=str))
        if size > MAX_SPEC_BYTES:
            sizes = {k: len(json.dumps(v, default=str)) for k, v in data.items()}
            biggest = max(sizes, key=lambda k: sizes[k])
            raise ValueError(
                f"the spec is {size // 1024} KiB of JSON, more than the {MAX_SPEC_BYTES // 1024} KiB limit; "
                f"the largest field is spec.{biggest} ({sizes[biggest] // 1024} KiB)"
            )
        return data

    @model_validator(mode="after")
    def _consistency(self) -> GDNModelServerSpec:
        self.check_consistency()
        return self

    def check_consistency(self) -> None:
        """The checks across fields of a built spec (ValueError): run by validation, and by
        api/specpatch.py `SpecPatch.apply_model` after it changes INDEPENDENT_FIELDS without re-validating."""
        if self.cudagraph_mode is not None and self.cudagraph_mode != CudagraphMode.NONE.value and self.enforce_eager:
            raise ValueError("enforceEager: true disables CUDA graphs; drop cudagraphMode or enforceEager")
        if self.cudagraph_implementation is not None and self.enforce_eager:
            raise ValueError("enforceEager: true disables CUDA graphs; drop cudagraphImplementation or enforceEager")
        claim = self.model.cache.persistent_volume_claim
        if claim is not None and claim.access_mode not in SHARED_MODES:
            several = [
                what
                for what, yes in (
                    (f"replicas {self.replicas}", self.replicas > 1 and self.autoscaling is None),
                    ("autoscaling", self.autoscaling is not None and self.autoscaling.max_replicas > 1),
                    (f"nodes {self.nodes}", self.nodes > 1),
                )
                if yes
            ]
            if several:
                raise ValueError(
                    f"spec.model.cache.persistentVolumeClaim.accessMode {claim.access_mode} lets one node (or pod) mount the "
                    f"claim, but {' and '.join(several)} put engine pods on several nodes: they would wait for the volume "
                    "forever; use accessMode ReadWriteMany (a claim all pods share) or spec.model.cache.emptyDir (a cache per pod)"
                )
