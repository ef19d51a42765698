"""Scale-out parts of the GDNModelServer API: autoscaling and LLM-aware routing.

Multi-node parallelism lives on the spec itself (`pipelineParallelSize`, `nodes`, next to
`tensorParallelSize`, named after vLLM's own `--pipeline-parallel-size` / `--nnodes`), validated in
api/spec.py. These models are included by GDNModelServerSpec (and so by the generated CRD).
"""

from __future__ import annotations

import enum
import re

from pydantic import ConfigDict, Field, field_validator, model_validator

from gdn_operator.api.base import _Model, cel

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class AutoscalingMetric(str, enum.Enum):
    """vLLM load metrics users scale on (names as the engine's /metrics exports them, without `vllm:`)."""

    NUM_REQUESTS_WAITING = "num_requests_waiting"
    NUM_REQUESTS_RUNNING = "num_requests_running"
    KV_CACHE_USAGE = "kv_cache_usage_perc"


#: Metric → (Prometheus series, aggregation across the server's engines, what `target` means).
METRICS: dict[str, tuple[str, str, str]] = {
    "num_requests_waiting": ("vllm:num_requests_waiting", "sum", "queued requests per engine"),
    "num_requests_running": ("vllm:num_requests_running", "sum", "running requests per engine"),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "avg", "mean KV-cache usage (0-1)"),
}


class AutoscalingSpec(_Model):
    """Scale engine replicas (groups, for multi-node engines) on vLLM load.

    The operator renders a KEDA ScaledObject (Prometheus trigger) when KEDA is installed and the chart
    configures a Prometheus address, otherwise an autoscaling/v2 HorizontalPodAutoscaler on a Pods metric
    (needs prometheus-adapter exposing the vLLM series). Both target the engine workload's scale subresource
    (Deployment, or LeaderWorkerSet for multi-node engines); scale-ups pause while the server is CrashLooping."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas", "minReplicas is above maxReplicas"),
            (
                "!has(self.metric) || self.metric != 'kv_cache_usage_perc' || self.target <= 1.0",
                "target for kv_cache_usage_perc must be a fraction between 0 and 1 (e.g. 0.8)",
            ),
        )
    )

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest engine replicas.")
    max_replicas: int = Field(ge=1, le=1000, description="Most engine replicas.")
    metric: AutoscalingMetric = Field(
        default=AutoscalingMetric.NUM_REQUESTS_WAITING,
        description="vLLM metric: num_requests_waiting, num_requests_running or kv_cache_usage_perc.",
    )
    target: float = Field(
        gt=0,
        le=100000,
        description=(
            "Target per engine: queued/running requests per engine for the request metrics, mean KV-cache "
            "usage fraction (0-1) for kv_cache_usage_perc."
        ),
    )
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, le=3600, description="Look-back window before scaling down (HPA stabilization window)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas {self.min_replicas} is above maxReplicas {self.max_replicas}; raise maxReplicas or lower minReplicas"
            )
        if self.metric == AutoscalingMetric.KV_CACHE_USAGE.value and self.target > 1:
            raise ValueError(f"target {self.target:g} for kv_cache_usage_perc must be a fraction between 0 and 1 (e.g. 0.8)")
        return self


class EndpointPickerSpec(_Model):
    """The Endpoint Picker (EPP) Service the gateway asks which engine should take a request."""

    name: str = Field(min_length=1, max_length=253, description="Name of the EPP Service (same namespace).")
    port: int = Field(default=9002, ge=1, le=65535, description="EPP Service port (gRPC ext-proc).")
    failure_mode: str = Field(
        default="FailClose", description="FailOpen or FailClose: what the gateway does when the EPP does not answer."
    )

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS1123.match(v):
            raise ValueError(f"{v!r} is not a valid Service name (lowercase letters, digits and '-')")
        return v

    @field_validator("failure_mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v not in ("FailOpen", "FailClose"):
            raise ValueError(f"{v!r} must be FailOpen or FailClose")
        return v


class InferencePoolRouteSpec(_Model):
    """Publish the engines as a Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1)."""

    endpoint_picker: EndpointPickerSpec = Field(description="The EPP that picks engines for the pool.")


class RouterSpec(_Model):
    """LLM-aware routing."""

    inference_pool: InferencePoolRouteSpec | None = Field(
        default=None, description="Render an InferencePool selecting this server's engines (API-serving pods only)."
    )
