"""GDNModelServer, the whole object (apiVersion, kind, metadata, spec, status), as gdnctl reads
manifests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gdn_operator.api.base import _Model
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.status import GDNModelServerStatus


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
