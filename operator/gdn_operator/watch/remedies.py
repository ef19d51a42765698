"""Remediation actions as spec changes: the `actions:` table of the signature catalogue (data/signatures.yaml).

A signature's `remediation.action` (and each step of its `remediation.ladder`) names an action; the
table says what that action changes in the spec, in the shape of a rule's `mitigation`
(rules/data/rules.yaml): camelCase spec paths → value, null unsets. `action_patch` is the pure function
the crash watch asks for the change an action makes to a given spec (an api.specpatch.SpecPatch), or
None when the action needs a human, does not apply to that spec, or is already in effect.

An action is one or more of
    set:      {path: value}                          these values (the pairs already in effect are left out)
    lower:    {path: {by: N, at_most: M, at_least: L}}  the number at path lowered by N and capped at M;
                                                     does not apply when the result is below L or no lower
    drop_env: {NAME: VALUE}                          the spec.env entry NAME (set to VALUE) removed; does not
                                                     apply when no entry has that value
with an optional `only_if: {path: value}` that must hold in the spec (defaults included), and an optional
`versions: RANGE` (the rules' range syntax, gdn_operator/versions.py): the vLLM releases the change exists in; it
does not apply to a spec whose spec.image.vllmVersion is outside them or not a version (issue 46: no
disable-v2-model-runner where vLLM has no V1 runner); or
    manual:   why a human decides (never applied automatically).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gdn_operator.api.specpatch import SpecPatch, check_path, get_path
from gdn_operator.versions import VersionRange, parse_version

if TYPE_CHECKING:
    from gdn_operator.api.spec import GDNModelServerSpec

_KEYS = ("set", "lower", "drop_env", "only_if", "versions", "manual")


class ActionError(ValueError):
    """An `actions:` entry is malformed; the message names the file, action and field."""


@dataclass(frozen=True)
class Lower:
    path: str
    by: int
    at_most: int
    at_least: int


@dataclass(frozen=True)
class Action:
    id: str
    set: SpecPatch = SpecPatch()
    lower: tuple[Lower, ...] = ()
    drop_env: tuple[tuple[str, str], ...] = ()
    only_if: tuple[tuple[str, Any], ...] = ()
    versions: str | None = None  # the vLLM releases the change exists in, a range (None: every release)
    manual: str | None = None  # a human decides: why


def _path(where: str, path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise ActionError(f"{where}: expected a camelCase spec path, got {path!r}")
    why = check_path(path)
    if why:
        raise ActionError(f"{where}: {why} (paths are camelCase spec paths like speculativeDecoding.enabled)")
    return path


def _mapping(where: str, v: Any) -> dict[Any, Any]:
    if not isinstance(v, dict) or not v:
        raise ActionError(f"{where}: expected a non-empty mapping")
    return v


def _int(where: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ActionError(f"{where}: expected an integer, got {v!r}")
    return v


@functools.lru_cache(maxsize=64)
def _range(text: str) -> VersionRange:
    return VersionRange(text)


def parse_action(where: str, aid: str, a: Any) -> Action:
    if a is None or not isinstance(a, dict) or not a:
        raise ActionError(f"{where}: needs one of set, lower, drop_env (a spec change) or manual (why a human decides)")
    unknown = sorted(set(a) - set(_KEYS))
    if unknown:
        raise ActionError(f"{where}: unknown field(s) {', '.join(map(str, unknown))} (allowed: {', '.join(_KEYS)})")
    if a.get("manual") is not None:
        if set(a) != {"manual"} or not isinstance(a["manual"], str) or not a["manual"].strip():
            raise ActionError(f"{where}: 'manual' is a non-empty reason and stands alone (no spec change)")
        return Action(aid, manual=" ".join(a["manual"].split()))
    if not any(k in a for k in ("set", "lower", "drop_env")):
        raise ActionError(f"{where}: needs a spec change (set, lower or drop_env) or 'manual'")
    sets = (
        SpecPatch.of((_path(f"{where}.set", p), v) for p, v in _mapping(f"{where}.set", a["set"]).items())
        if "set" in a
        else SpecPatch()
    )
    lowers = []
    for p, how in _mapping(f"{where}.lower", a["lower"]).items() if "lower" in a else ():
        lw = f"{where}.lower.{p}"
        how = _mapping(lw, how)
        if set(how) != {"by", "at_most", "at_least"}:
            raise ActionError(f"{lw}: needs exactly by, at_most and at_least")
        lowers.append(
            Lower(
                _path(lw, p),
                _int(f"{lw}.by", how["by"]),
                _int(f"{lw}.at_most", how["at_most"]),
                _int(f"{lw}.at_least", how["at_least"]),
            )
        )
        if lowers[-1].by < 1:
            raise ActionError(f"{lw}.by: must be at least 1")
    drops = []
    for name, value in _mapping(f"{where}.drop_env", a["drop_env"]).items() if "drop_env" in a else ():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ActionError(f'{where}.drop_env: expected NAME: "VALUE" strings, got {name!r}: {value!r}')
        drops.append((name, value))
    only = (
        tuple((_path(f"{where}.only_if", p), v) for p, v in _mapping(f"{where}.only_if", a["only_if"]).items())
        if "only_if" in a
        else ()
    )
    versions = None
    if "versions" in a:
        if not isinstance(a["versions"], str) or not a["versions"].strip():
            raise ActionError(f"{where}.versions: expected a version range such as '<0.34.0'")
        try:
            versions = str(_range(a["versions"]))
        except ValueError as e:
            raise ActionError(f"{where}.versions: {e}") from None
    return Action(aid, sets, tuple(lowers), tuple(drops), only, versions)


def parse_actions(path: str, data: Any) -> dict[str, Action]:
    """The `actions:` table of a catalogue document (action id → Action)."""
    if not isinstance(data, dict) or not data:
        raise ActionError(f"{path}: field 'actions' must be a mapping action id -> spec change")
    return {str(aid): parse_action(f"{path}: actions.{aid}", str(aid), a) for aid, a in data.items()}


def action_patch(action: Action | None, spec: GDNModelServerSpec) -> SpecPatch | None:
    """The change `action` makes to `spec`; None when it needs a human, does not apply, or is in effect."""
    if action is None or action.manual is not None:
        return None
    if action.versions is not None:
        ver = parse_version(spec.image.vllm_version)
        if ver is None or not _range(action.versions).contains(ver):
            return None  # the change does not exist in this release
    current = spec.model_dump(by_alias=True, mode="json")  # defaults included: unset means the default
    if any(get_path(current, p)[1] != v for p, v in action.only_if):
        return None
    changes = list(action.set.pending(current).changes)
    for lw in action.lower:
        now = get_path(current, lw.path)[1]
        if not isinstance(now, int):
            return None
        target = min(now - lw.by, lw.at_most)
        if target < lw.at_least or target >= now:
            return None
        changes.append((lw.path, target))
    label = None
    if action.drop_env:
        names = [n for n, _ in action.drop_env]
        if not any(e.name == n and e.value == v for e in spec.env for n, v in action.drop_env):
            return None
        keep = [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in spec.env if e.name not in names]
        # a whole list does not read well as path=value: say what went
        label = ", ".join([*([SpecPatch(tuple(changes)).describe()] if changes else []), f"env {', '.join(names)} removed"])
        changes.append(("env", keep))
    return SpecPatch(tuple(changes), label) if changes else None
