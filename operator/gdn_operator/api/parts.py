"""The parts of a GDNModelServer spec: what to serve (model, image), speculative decoding, engine
environment, per-pod resources, crash remediation and metrics settings.

GDNModelServerSpec (api/spec.py) puts them together and checks what spans several parts.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator

from gdn_operator.api import k8s as _k8s
from gdn_operator.api import vllm_args as _vllm_args
from gdn_operator.api.base import _Model, cel
from gdn_operator.api.cache import ModelCacheSpec, check_hub_endpoint
from gdn_operator.api.enums import Architecture, PullPolicy, RemediationMode, SpecMethod

#: Environment variables the operator sets itself. What extraArgs / env may not set is data:
#: api/data/extra-args-policy.yaml, applied by api/vllm_args.py with the target release's option table.
OPERATOR_OWNED_ENV = frozenset(_vllm_args.policy()["env"]["owned"])

_MODEL_URI = re.compile(r"^(hf|pvc|s3|gs|oci|file)://\S+$")
#: A Hub revision: a branch, a tag or a commit hash (what `hf download --revision` and vLLM's --revision take).
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
#: Schemes the URI pattern recognises that nothing in the engine pod loads yet: refused with the way out.
UNLOADED_SCHEMES = {
    "oci": "oci:// model images have no loader in the engine pod yet; push the model to a Hub (hf://, with "
    "hubEndpoint for a mirror) or copy it into a claim (pvc://CLAIM/PATH)",
}


class SecretKeyRef(_Model):
    """A key in a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key inside the Secret.")

    @field_validator("name")
    @classmethod
    def _secret_name(cls, v: str) -> str:
        return _k8s.check_name(v, "Secret name")

    @field_validator("key")
    @classmethod
    def _secret_key(cls, v: str) -> str:
        return _k8s.check_key(v, "Secret key")


class ConfigMapKeyRef(_Model):
    """A key in a ConfigMap in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="ConfigMap name.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the ConfigMap.")

    @field_validator("name")
    @classmethod
    def _cm_name(cls, v: str) -> str:
        return _k8s.check_name(v, "ConfigMap name")

    @field_validator("key")
    @classmethod
    def _cm_key(cls, v: str) -> str:
        return _k8s.check_key(v, "ConfigMap key")


class ModelSpec(_Model):
    """What to serve."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!self.uri.startsWith('oci://')", UNLOADED_SCHEMES["oci"]),
            ("self.uri.startsWith('hf://') || !has(self.revision)", "revision applies to hf:// models"),
            ("self.uri.startsWith('hf://') || !has(self.hubEndpoint)", "hubEndpoint applies to hf:// models"),
            (
                "self.uri.startsWith('hf://') || !has(self.cache) || !has(self.cache.persistentVolumeClaim)",
                "cache.persistentVolumeClaim applies to hf:// models",
            ),
        )
    )

    uri: str = Field(
        description=(
            "Model source: hf://ORG/NAME (downloaded by vLLM), pvc://CLAIM/PATH (a pre-populated "
            "PersistentVolumeClaim mounted read-only), or s3://, gs://, file:// URIs (oci:// is refused: nothing "
            "loads it yet)."
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
        default=None, description="Secret holding a Hugging Face token, passed to the download step and the engine as HF_TOKEN."
    )
    hub_endpoint: str | None = Field(
        default=None,
        max_length=1024,
        description="Hugging Face Hub mirror for hf:// downloads (HF_ENDPOINT), e.g. https://hf-mirror.example.com.",
    )
    revision: str | None = Field(
        default=None,
        max_length=255,
        description=(
            "hf:// models: the Hub revision (commit hash, tag or branch) the download step fetches and the engine "
            "loads (--revision). Unset: the repository's default branch, which can move under a running server; "
            "pin a commit hash in production."
        ),
        json_schema_extra={"pattern": REVISION.pattern},
    )
    cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec, description="Where the model cache lives (HF_HOME).")

    _hub = field_validator("hub_endpoint")(classmethod(lambda cls, v: check_hub_endpoint(v)))

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        if not _MODEL_URI.fullmatch(v):
            raise ValueError("must look like hf://ORG/NAME or pvc://CLAIM/PATH (also s3://, gs://, file://)")
        scheme = v.split("://", 1)[0]
        if scheme in UNLOADED_SCHEMES:
            raise ValueError(UNLOADED_SCHEMES[scheme])
        if v.startswith("pvc://"):
            claim = v[len("pvc://") :].split("/", 1)[0]
            if not _k8s.dns1123_subdomain(claim):
                raise ValueError(f"pvc:// claim name {claim!r} is not a valid Kubernetes name")
        return v

    @field_validator("revision")
    @classmethod
    def _check_revision(cls, v: str | None) -> str | None:
        if v is not None and (not REVISION.fullmatch(v) or ".." in v):
            raise ValueError(f"{v!r} is not a Hub revision: a commit hash, a tag or a branch name (e.g. main)")
        return v

    @model_validator(mode="after")
    def _cache_for_hub_models(self) -> ModelSpec:
        if not self.uri.startswith("hf://") and self.revision is not None:
            raise ValueError(
                f"revision applies to hf:// models (downloaded from the Hub); {self.uri.split('://')[0]}:// models "
                "have no Hub revision; remove it"
            )
        if not self.uri.startswith("hf://") and (self.cache.persistent_volume_claim is not None or self.hub_endpoint):
            what = "cache.persistentVolumeClaim" if self.cache.persistent_volume_claim is not None else "hubEndpoint"
            raise ValueError(
                f"{what} applies to hf:// models (downloaded from the Hub); {self.uri.split('://')[0]}:// "
                "models are not downloaded into the cache; remove it"
            )
        return self

    @property
    def is_hub(self) -> bool:
        return self.uri.startswith("hf://")

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
    config_map_key_ref: ConfigMapKeyRef | None = Field(default=None, description="Take the value from a ConfigMap key.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _k8s.ENV_NAME.fullmatch(v):
            raise ValueError("must be a valid environment variable name")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if sum(x is not None for x in (self.value, self.secret_key_ref, self.config_map_key_ref)) > 1:
            raise ValueError("set one of value, secretKeyRef or configMapKeyRef")
        return self


class ResourcesSpec(_Model):
    """Compute for one engine pod. GPUs are always tensorParallelSize."""

    gpu_type: str | None = Field(
        default=None,
        max_length=63,
        description="GPU product (node label nvidia.com/gpu.product), e.g. NVIDIA-H100-80GB-HBM3.",
        json_schema_extra={"pattern": f"^{_k8s.LABEL_VALUE.pattern}$"},
    )

    @field_validator("gpu_type")
    @classmethod
    def _label_value(cls, v: str | None) -> str | None:
        if v is not None and not _k8s.label_value(v):
            raise ValueError(
                f"{v!r} is not a valid label value (the node label nvidia.com/gpu.product uses '-' for spaces, e.g. NVIDIA-H100-80GB-HBM3)"
            )
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


class HealthSpec(_Model):
    """Engine liveness beyond /health: the stall detector (gdn_operator.watch.stall) on the scraped /metrics."""

    stall_seconds: int = Field(
        default=120,
        ge=30,
        le=3600,
        description=(
            "Seconds an engine may hold requests (running or waiting) while producing under 0.5 output tokens per "
            "running request per second before it is Stalled (condition Stalled; the pod is restarted once "
            "per generation under remediation.mode auto). Default 120: the FULL-graph stalls captured on vLLM "
            "0.22.0 step once every 20-70 s, a healthy engine drains in seconds. Needs spec.metrics.enabled and "
            "at least twice spec.metrics.scrapeIntervalSeconds."
        ),
    )
