"""A change to a GDNModelServer spec: built once, then applied or sent as the patch each consumer needs.

The shape is the one the YAML data uses for changes (a rule's `mitigation` in rules/data/rules.yaml,
a remediation action's `set` in watch/data/signatures.yaml): camelCase dotted spec paths → new value,
`None` (YAML null) unsets the field. A `SpecPatch` keeps those pairs in order:

    p = SpecPatch.of({"speculativeDecoding.enabled": False})
    p.apply(spec)          a new spec dict with the change (the evaluator validates it again)
    p.pending(spec)        only the pairs not already in effect (a remediation is never re-applied)
    p.merge_patch()        RFC 7386 body for .spec (the mutating webhook, the crash watch)
    p.json_patch(spec)     RFC 6902 ops under /spec against the spec as submitted (gdnctl validate)
    p.describe()           "speculativeDecoding.enabled=false" (status.remediations[].action)
    p.summary()            "speculativeDecoding.enabled: false" (admission finding messages)

Also here, the one home for writing into nested spec dicts: `get_path` / `set_path`, `merge` (a merge
patch applied the way the API server applies it) and `check_path` (does a path name a spec field; the
YAML loaders validate with it).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gdn_operator.api.spec import INDEPENDENT_FIELDS, GDNModelServerSpec


def get_path(d: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """(present, value) of a dotted path in a nested dict."""
    cur: Any = d
    for p in path.split("."):
        if not isinstance(cur, Mapping) or p not in cur:
            return False, None
        cur = cur[p]
    return True, cur


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path in a nested dict in place, creating parents; `None` removes the field."""
    parts = path.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            if value is None:
                return  # nothing to remove below a missing parent
            nxt = {}
            cur[p] = nxt
        cur = nxt
    if value is None:
        cur.pop(parts[-1], None)
    else:
        cur[parts[-1]] = value


def merge(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with the RFC 7386 merge patch applied (a new dict; objects merge, null deletes, anything
    else, lists included, replaces)."""
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping):
            base = out.get(k)
            out[k] = merge(base if isinstance(base, Mapping) else {}, v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def check_path(path: str) -> str | None:
    """Why the camelCase dotted path (relative to spec) names no GDNModelServerSpec field; None if it does."""
    model: Any = GDNModelServerSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None:
            return f"{'.'.join(parts[:i])} has no sub-fields"
        match = next((f for name, f in fields.items() if (f.alias or name) == part), None)
        if match is None:
            return f"unknown spec field {part!r} in {path!r}"
        ann = match.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
    return None


def _text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class SpecPatch:
    """An ordered change to a spec: (camelCase dotted path, value) pairs, `None` = unset.

    `label` names a change whose values do not read well (a whole list replaced, e.g. "env
    NCCL_P2P_DISABLE removed"); it is then what `describe()` says."""

    changes: tuple[tuple[str, Any], ...] = ()
    label: str | None = None

    @classmethod
    def of(cls, changes: Mapping[str, Any] | Iterable[tuple[str, Any]] | None, label: str | None = None) -> SpecPatch:
        items = changes.items() if isinstance(changes, Mapping) else (changes or ())
        return cls(tuple((str(p), v) for p, v in items), label)

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __add__(self, other: SpecPatch) -> SpecPatch:
        return SpecPatch(self.changes + other.changes)

    def as_dict(self) -> dict[str, Any]:
        """The flat form the YAML and status.findings[].mitigation use (a later pair for a path wins)."""
        return dict(self.changes)

    def apply(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A deep copy of `spec` with the changes made."""
        out = copy.deepcopy(dict(spec))
        for path, value in self.changes:
            set_path(out, path, copy.deepcopy(value))
        return out

    def apply_shared(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """What `apply` returns, copying only the dicts along the changed paths: the result shares every other
        value with `spec`, so it is for read-only use (validating a candidate spec on the admission hot path)."""
        out = dict(spec)
        for path, value in self.changes:
            parts = path.split(".")
            cur = out
            for p in parts[:-1]:
                nxt = cur.get(p)
                if not isinstance(nxt, dict):
                    if value is None:
                        break  # nothing to remove below a missing parent (set_path)
                    nxt = {}
                else:
                    nxt = dict(nxt)  # copy on write: `spec`'s own dict is never changed
                cur[p] = nxt
                cur = nxt
            else:
                if value is None:
                    cur.pop(parts[-1], None)
                else:
                    cur[parts[-1]] = copy.deepcopy(value)
        return out

    def apply_model(self, spec: GDNModelServerSpec) -> GDNModelServerSpec:
        """The validated spec `apply` gives for `spec` as submitted (ValidationError when it is invalid), without
        re-validating what the change leaves alone where it may: a patch that sets only INDEPENDENT_FIELDS
        (api/spec.py) to values is made with model copies and the cross-field check (`check_consistency`), its
        values validated by pydantic the first time this patch is applied (the same value always validates the
        same way; the memo lives on the patch, made once per rule at start-up). What differs from a full
        validation: the input-size and depth bounds are not re-measured (they bound what a client sends; a
        resolved spec is never sent). Anything else (an unset, another field) is the full dump-and-validate."""
        fields: tuple[tuple[tuple[str, ...], Any], ...] | None = self.__dict__.get("_validated")
        if fields is not None:
            try:
                return _with_fields(spec, fields)
            except ValueError:
                pass  # a cross-field check fails: the full validation below raises the ValidationError saying why
        out = GDNModelServerSpec.model_validate(
            self.apply_shared(spec.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        )
        if fields is None and self.changes:
            learned = _validated_fields(self, out)
            if learned is not None:
                self.__dict__["_validated"] = learned  # frozen dataclass: the memo is no field (eq/hash ignore it)
        return out

    def pending(self, spec: Mapping[str, Any]) -> SpecPatch:
        """The pairs whose value `spec` does not already have (an absent field counts as unset)."""
        return SpecPatch(tuple((p, v) for p, v in self.changes if get_path(spec, p)[1] != v), self.label)

    def pending_in(self, spec: BaseModel) -> SpecPatch:
        """`pending` against a spec model as submitted (its set fields; an unset field counts as unset), without
        dumping it."""
        return SpecPatch(tuple((p, v) for p, v in self.changes if set_value(spec, p)[1] != v), self.label)

    def merge_patch(self) -> dict[str, Any]:
        """The RFC 7386 merge patch for .spec (null unsets a field)."""
        out: dict[str, Any] = {}
        for path, value in self.changes:
            parts = path.split(".")
            node = out
            for p in parts[:-1]:
                nxt = node.get(p)
                if not isinstance(nxt, dict):
                    nxt = node[p] = {}
                node = nxt
            node[parts[-1]] = copy.deepcopy(value)
        return out

    def json_patch(self, original: Mapping[str, Any], prefix: str = "/spec") -> list[dict[str, Any]]:
        """RFC 6902 ops turning `original` (the spec as submitted) into the changed spec, under `prefix`.
        A missing parent object is added whole; an unset of an absent field or a value already there is
        no op."""
        cur = copy.deepcopy(dict(original))
        ops: list[dict[str, Any]] = []
        for path, value in self.changes:
            parts = path.split(".")
            if value is None:
                if get_path(cur, path)[0]:
                    ops.append({"op": "remove", "path": f"{prefix}/" + "/".join(parts)})
                    set_path(cur, path, None)
                continue
            node = cur
            for i, p in enumerate(parts[:-1]):
                if not isinstance(node.get(p), dict):
                    sub: Any = value
                    for q in reversed(parts[i + 1 :]):
                        sub = {q: sub}
                    ops.append({"op": "add", "path": f"{prefix}/" + "/".join(parts[: i + 1]), "value": sub})
                    break
                node = node[p]
            else:
                present, old = get_path(cur, path)
                if present and old == value:
                    continue
                ops.append({"op": "replace" if present else "add", "path": f"{prefix}/" + "/".join(parts), "value": value})
            set_path(cur, path, value)
        return ops

    def describe(self) -> str:
        """ "path=value, ..." (or the label): the action recorded in status.remediations and Events."""
        return self.label or ", ".join(f"{p}={_text(v)}" for p, v in self.changes)

    def summary(self) -> str:
        """ "path: value, ...": how admission findings name the mitigation."""
        return ", ".join(f"{p}: {_text(v)}" for p, v in self.changes)


def _field_names(path: str) -> tuple[str, ...] | None:
    """The field names along a camelCase dotted spec path (None when it names no field)."""
    model: Any = GDNModelServerSpec
    names: list[str] = []
    for part in path.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        name = _by_alias(model).get(part)
        if name is None:
            return None
        names.append(name)
        ann = model.model_fields[name].annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
    return tuple(names)


def _validated_fields(patch: SpecPatch, validated: GDNModelServerSpec) -> tuple[tuple[tuple[str, ...], Any], ...] | None:
    """(field names, validated value) per change of `patch`, read from a spec it was validated into; None when a
    change unsets a field, leaves INDEPENDENT_FIELDS or goes deeper than one sub-model."""
    out = []
    for path, value in patch.changes:
        names = _field_names(path)
        if value is None or names is None or names[0] not in INDEPENDENT_FIELDS or len(names) > 2:
            return None
        got: Any = validated
        for n in names:
            got = getattr(got, n)
        out.append((names, got))
    return tuple(out)


def _with_fields(spec: GDNModelServerSpec, fields: tuple[tuple[tuple[str, ...], Any], ...]) -> GDNModelServerSpec:
    """`spec` with validated values set at field-name paths (model copies: set fields are marked set, as
    validation from a dict holding them marks them), then its cross-field check (ValueError)."""
    update: dict[str, Any] = {}
    for names, value in fields:
        if len(names) == 1:
            update[names[0]] = value
        else:
            top = names[0]
            sub = update.get(top, getattr(spec, top))
            update[top] = sub.model_copy(update={names[1]: value})
    out = spec.model_copy(update=update)
    out.check_consistency()
    return out


def user_set(model: Any, path: str) -> bool:
    """Whether the camelCase dotted `path` was given in the input `model` (a pydantic spec model) was
    validated from, as opposed to left to its default: pydantic's `model_fields_set`, walked by alias."""
    return _walk(model, path)[0]


def set_value(model: Any, path: str) -> tuple[bool, Any]:
    """(given, value) of the camelCase dotted `path` in the input `model` was validated from: what `get_path`
    answers for the model's `model_dump(by_alias=True, exclude_unset=True, mode="json")`, without the dump."""
    given, value = _walk(model, path)
    return given, _json(value) if given else None


def _walk(model: Any, path: str) -> tuple[bool, Any]:
    cur = model
    for part in path.split("."):
        if not isinstance(cur, BaseModel):
            return False, None
        name = _by_alias(type(cur)).get(part)
        if name is None or name not in cur.model_fields_set:
            return False, None
        cur = getattr(cur, name)
    return True, cur


def _json(value: Any) -> Any:
    """A set value as the exclude-unset JSON dump holds it."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


@functools.cache
def _by_alias(model: type[BaseModel]) -> dict[str, str]:
    """camelCase alias (or the name, without one) -> field name, per model class (the first field wins)."""
    out: dict[str, str] = {}
    for n, f in model.model_fields.items():
        out.setdefault(f.alias or n, n)
    return out
