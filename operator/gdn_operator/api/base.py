"""Base classes of the API models (camelCase aliases, strict spec, tolerant status), shared by
the API model modules (api/parts.py, api/spec.py, api/status.py, api/probes.py, ...)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """A model's invariants as CEL (`x-kubernetes-validations`, each (rule, message)), for `json_schema_extra`:
    api/crd.py carries them into the CRD, so the API server itself refuses what they forbid — with
    `kubectl apply --dry-run=server`, and while the admission webhook is down. Each rule restates a pydantic
    validator of the same model (the webhook's answer, with its longer message); every rule guards the
    fields it reads with has() (a rule that errors refuses the object), and tests/integration/test_crd_cel.py
    holds each rule to its validator on the real API server."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class _Model(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, enum values kept as plain strings."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    def dump(self) -> dict[str, Any]:
        """The Kubernetes-shaped dict: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class _Status(_Model):
    # Status is written by the operator; tolerate fields from newer operator versions.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", use_enum_values=True)
