"""Overrides: values the operator runs instead of what the user's spec says, owned by the operator.

The operator never writes a server's `.spec`, `metadata.generation` or the user's annotations (GitOps
controllers would revert the change, or show drift). A crash remediation or an admission mitigation
(`admissionPolicy: mitigate`) is instead an entry of `status.overrides`:

    {path: camelCase spec path, value, reason: rule id or crash signature, source: mitigation | remediation,
     generation: the spec generation it was made on, since: RFC 3339 time, userValue: the spec's value at
     path then (absent = unset), vllmVersion: spec.image.vllmVersion then}

and is applied when the workload is rendered: `apply_overrides(spec, overrides) -> spec` (pure).
Handlers add one with `add_override(status, ...)` and read the live ones with `live_overrides(...)`.

Mitigation entries are recomputed from the spec on every reconcile (they end with the rule). A remediation
entry ENDS when (checked on every reconcile, `live_overrides`):

* the user changes that field (the spec's value at `path` is no longer `userValue`) — including setting it
  to the override's own value, which makes the override redundant;
* a new generation runs another vLLM version (`spec.image.vllmVersion` differs): the crash is re-learned;
* the user asks: annotation `serving.gdn-operator.io/clear-overrides` set to a new value (any token, e.g.
  `kubectl annotate gms NAME serving.gdn-operator.io/clear-overrides="$(date +%s)" --overwrite`). The
  annotation is the user's: the operator reads it and never writes it; it remembers the token it acted on
  in `status.overridesCleared`.

Other edits (replicas, a new image tag of the same vLLM version, ...) keep the remediation: it still
matches the configuration that crashed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field

from gdn_operator.api.base import _Status
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch, get_path

CLEAR_ANNOTATION = "serving.gdn-operator.io/clear-overrides"
#: status key: the clear-overrides token the operator last acted on
CLEARED_KEY = "overridesCleared"
MAX_OVERRIDES = 32
_ABSENT = {"unset": True}  # userValue of a field the spec left unset (JSON null would read as "set to null")

Source = Literal["mitigation", "remediation"]


class Override(_Status):
    """One value the operator renders instead of the spec's (status.overrides[])."""

    path: str = Field(description="camelCase spec path, e.g. asyncScheduling.")
    value: Any = Field(default=None, description="The value rendered (null: the field is left unset).")
    reason: str = Field(description="The rule id (mitigation) or crash signature (remediation) behind it.")
    source: Source = Field(
        default="remediation", description="mitigation (admission policy) or remediation (crash watch, output probes)."
    )
    generation: int | None = Field(default=None, description="Spec generation it was made on.")
    since: str | None = Field(default=None, description="RFC 3339 time it was made.")
    user_value: Any = Field(default=None, description="The spec's value at path when it was made ({unset: true} when unset).")
    vllm_version: str | None = Field(default=None, description="spec.image.vllmVersion when it was made.")


def apply_overrides(spec: GDNModelServerSpec, overrides: Iterable[Override | Mapping[str, Any]]) -> GDNModelServerSpec:
    """`spec` with the overrides' values (a new, validated spec; the input is not changed). Fields an override
    sets count as set (the admission policy judges them, no safe default replaces them)."""
    items = [o if isinstance(o, Override) else Override.model_validate(o) for o in overrides]
    if not items:
        return spec
    d = SpecPatch.of((o.path, o.value) for o in items).apply(spec.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    return GDNModelServerSpec.model_validate(d)


def _user_value(spec: Mapping[str, Any], path: str) -> Any:
    present, value = get_path(spec, path)
    return copy.deepcopy(value) if present else dict(_ABSENT)


def entries(
    patch: SpecPatch, *, reason: str, source: Source, generation: int | None, since: str | None, spec: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """status.overrides entries for a change to the user's `spec` (camelCase dict, as stored)."""
    version = get_path(spec, "image.vllmVersion")[1]
    return [
        Override(
            path=p,
            value=copy.deepcopy(v),
            reason=reason,
            source=source,
            generation=generation,
            since=since,
            user_value=_user_value(spec, p),
            vllm_version=version,
        ).model_dump(by_alias=True, exclude_none=True, mode="json")
        for p, v in patch.changes
    ]


def set_overrides(status: dict[str, Any], overrides: list[dict[str, Any]]) -> None:
    """Set status.overrides: the overrides in force (this module owns the key; handlers/core/servers.py STATUS)."""
    status["overrides"] = overrides


def add_override(
    status: dict[str, Any],
    patch: SpecPatch,
    *,
    reason: str,
    generation: int | None,
    since: str | None,
    spec: Mapping[str, Any],
    source: Source = "remediation",
) -> list[dict[str, Any]]:
    """Record `patch` as operator-owned overrides in `status` (in place; a later entry for a path replaces an
    earlier one). Returns the new entries. The one way handlers add an override."""
    new = entries(patch, reason=reason, source=source, generation=generation, since=since, spec=spec)
    paths = {e["path"] for e in new}
    kept = [o for o in status.get("overrides") or [] if o.get("path") not in paths]
    status["overrides"] = (kept + new)[-MAX_OVERRIDES:]
    return new


def ended_because(o: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """Why a remediation override no longer holds for `spec` (the user's, camelCase), or None while it does."""
    path = str(o.get("path"))
    if _user_value(spec, path) != o.get("userValue", _ABSENT):
        return f"the spec changed {path}"
    version = get_path(spec, "image.vllmVersion")[1]
    if o.get("vllmVersion") is not None and version != o.get("vllmVersion"):
        return f"spec.image.vllmVersion is now {version} (the override was made on {o.get('vllmVersion')})"
    return None


def live_overrides(
    status: Mapping[str, Any], spec: Mapping[str, Any], annotations: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]], str | None]:
    """(remediation overrides still in force, [(ended override, why)], clear token to record or None).

    Mitigation entries are not returned: they are recomputed from the spec on every reconcile."""
    token = (annotations or {}).get(CLEAR_ANNOTATION)
    clear = token is not None and token != status.get(CLEARED_KEY)
    kept: list[dict[str, Any]] = []
    ended: list[tuple[dict[str, Any], str]] = []
    for o in status.get("overrides") or []:
        if o.get("source") == "mitigation":
            continue
        why = f"annotation {CLEAR_ANNOTATION}={token}" if clear else ended_because(o, spec)
        if why:
            ended.append((dict(o), why))
        else:
            kept.append(dict(o))
    return kept, ended, (str(token) if clear else None)


def revision(generation: int | None, overrides: Iterable[Mapping[str, Any]]) -> str:
    """The configuration a crash is counted against: the generation and the remediation overrides in force
    (a remediation changes what runs without a new generation, so the crash ladder's next step counts
    crashes of the new configuration only)."""
    live = sorted(
        json.dumps([o.get("path"), o.get("value")], sort_keys=True) for o in overrides if o.get("source") != "mitigation"
    )
    return f"{generation}" if not live else f"{generation}+{hashlib.sha256(''.join(live).encode()).hexdigest()[:8]}"
