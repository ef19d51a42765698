"""spec.model.cache: where the Hugging Face cache of the engine pods lives, and the download step that fills it.

Per pod `emptyDir` (the default; `sizeLimit` bounds it) or a PersistentVolumeClaim: an existing claim, or one
the operator creates from size / storageClassName / accessMode. A created claim is kept when the server is
deleted (retainPolicy Retain, the default: re-creating the server reuses the downloaded model instead of
fetching hundreds of GB again); retainPolicy Delete makes it owned by the server (deleted with it). A claim
is reused by later pods, restarts and rollouts: the model is downloaded once. For `hf://` models a download
step (an init container running the `hf` CLI of the vLLM image, `hf download REPO --revision R --include P…`)
fills the cache before the engine starts, and the engine then runs with HF_HUB_OFFLINE=1: it loads from the
cache and never reaches the Hub. A multi-node engine with a ReadWriteMany claim downloads once, on the
leader; its workers wait for the leader's download (render/podparts.py).
"""

from __future__ import annotations

import enum
import re

from pydantic import ConfigDict, Field, field_validator, model_validator

from gdn_operator.api import k8s as _k8s
from gdn_operator.api.base import _Model, cel


class RetainPolicy(str, enum.Enum):
    RETAIN = "Retain"
    DELETE = "Delete"


#: What the download step fetches when spec.model.cache.include is unset: what vLLM loads from a Hub
#: checkpoint (config and tokenizer files, safetensors weights, chat templates, remote code), not the
#: original/ folders, GGUF or .bin copies some repositories carry beside the safetensors.
DEFAULT_INCLUDE = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py")

_GLOB = re.compile(r"^[A-Za-z0-9._*?\[\]/-]{1,255}$")


class AccessMode(str, enum.Enum):
    RWO = "ReadWriteOnce"
    RWX = "ReadWriteMany"
    RWOP = "ReadWriteOncePod"


#: Access modes one claim can serve to several pods on several nodes.
SHARED_MODES = frozenset({AccessMode.RWX.value})

_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?")


def _quantity(v: str | None) -> str | None:
    if v is not None and not _k8s.positive_quantity(v):
        raise ValueError(f"{v!r} is not a Kubernetes quantity above zero (e.g. 100Gi)")
    return v


class EmptyDirCache(_Model):
    size_limit: str | None = Field(
        default=None,
        max_length=32,
        description="Bound of the per-pod cache (the kubelet evicts a pod that writes more); unset = unbounded.",
    )

    _size = field_validator("size_limit")(classmethod(lambda cls, v: _quantity(v)))


class ClaimCache(_Model):
    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "has(self.claimName) != has(self.size)",
                "set claimName (an existing claim) or size (the operator creates one), exactly one",
            ),
            (
                "!has(self.claimName) || !has(self.storageClassName)",
                "storageClassName applies to a claim the operator creates (size)",
            ),
            ("!has(self.claimName) || !has(self.retainPolicy)", "retainPolicy applies to a claim the operator creates (size)"),
        )
    )

    claim_name: str | None = Field(
        default=None, max_length=253, description="An existing PersistentVolumeClaim (its access mode must suit the replicas)."
    )
    size: str | None = Field(
        default=None,
        max_length=32,
        description="Create a claim `<server>-model-cache` of this size (kept or deleted with the server: retainPolicy).",
    )
    retain_policy: RetainPolicy | None = Field(
        default=None,
        description=(
            "A created claim (size) when the server is deleted: Retain (unset) keeps it with the downloaded "
            "model, and a server re-created with the same name reuses it; Delete makes the server own it (it is "
            "deleted with the server)."
        ),
    )
    storage_class_name: str | None = Field(default=None, max_length=253, description="StorageClass of the created claim.")
    access_mode: AccessMode = Field(
        default=AccessMode.RWX,
        description=(
            "Access mode of the created claim; for an existing claim, the mode it was made with. Several "
            "replicas or nodes need ReadWriteMany."
        ),
    )

    _size = field_validator("size")(classmethod(lambda cls, v: _quantity(v)))

    @field_validator("claim_name", "storage_class_name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return v if v is None else _k8s.check_name(v)

    @model_validator(mode="after")
    def _one(self) -> ClaimCache:
        if (self.claim_name is None) == (self.size is None):
            raise ValueError("set claimName (an existing claim) or size (the operator creates one), exactly one")
        if self.claim_name is not None and self.storage_class_name is not None:
            raise ValueError("storageClassName applies to a claim the operator creates (size); drop it with claimName")
        if self.claim_name is not None and self.retain_policy is not None:
            raise ValueError("retainPolicy applies to a claim the operator creates (size); an existing claim is never deleted")
        return self


class ModelCacheSpec(_Model):
    """The Hugging Face cache of the engine pods (HF_HOME)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.emptyDir) || !has(self.persistentVolumeClaim)", "set emptyDir or persistentVolumeClaim, not both"),
            ("!has(self.include) || size(self.include) > 0", 'an empty include fetches nothing; leave it unset or use ["*"]'),
        )
    )

    empty_dir: EmptyDirCache | None = Field(default=None, description="A per-pod emptyDir (the default).")
    persistent_volume_claim: ClaimCache | None = Field(
        default=None, description="A PersistentVolumeClaim shared by the pods and kept across rollouts."
    )
    download: bool = Field(
        default=True,
        description=(
            "hf:// models: download into the cache in an init container before the engine starts (idempotent, "
            "resumable), then run the engine offline (HF_HUB_OFFLINE=1). false: vLLM downloads at start."
        ),
    )
    include: list[str] | None = Field(
        default=None,
        max_length=32,
        description=(
            "Glob patterns of the repository files the download step fetches (hf download --include). Unset: "
            + ", ".join(DEFAULT_INCLUDE)
            + ' (what vLLM loads); ["*"] fetches the whole repository.'
        ),
    )

    @field_validator("include")
    @classmethod
    def _globs(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError('an empty include fetches nothing; leave it unset (the default patterns) or use ["*"]')
        bad = [p for p in v if not _GLOB.fullmatch(p)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a file glob (letters, digits, . _ - / * ? [ ]), e.g. *.safetensors")
        return v

    @property
    def include_patterns(self) -> tuple[str, ...]:
        return DEFAULT_INCLUDE if self.include is None else tuple(self.include)

    @model_validator(mode="after")
    def _one(self) -> ModelCacheSpec:
        if self.empty_dir is not None and self.persistent_volume_claim is not None:
            raise ValueError("set emptyDir or persistentVolumeClaim, not both")
        return self


def check_hub_endpoint(v: str | None) -> str | None:
    if v is not None and not _URL.fullmatch(v):
        raise ValueError(f"{v!r} is not an http(s) URL of a Hugging Face Hub mirror (e.g. https://hf-mirror.example.com)")
    return v
