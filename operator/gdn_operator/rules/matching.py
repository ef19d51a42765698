"""Matching: which rules and built-in checks hold for a resolved configuration (rules.effective.Effective),
before any admission policy is applied. Shared by the evaluator (rules/evaluator.py) and the safe
defaults (rules/defaults.py), so both read the rules the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.rules.effective import Effective, describe_field
from gdn_operator.rules.rulefile import Builtin, Rule, RuleSet

#: Paths whose change turns speculative decoding off: never a default, never "warned" as the fix (MTP stays on).
_SPEC_OFF = ("speculativeDecoding.enabled", "speculativeDecoding")


def keeps_spec_decoding(patch: SpecPatch) -> bool:
    """Whether applying `patch` leaves speculative decoding on."""
    return not any(p in _SPEC_OFF and v in (False, None, {}) for p, v in patch.changes)


@dataclass
class Hit:
    """A matched rule or built-in check, before the policy is applied."""

    ref: str
    title: str
    kind: str
    severity: str
    enforced: bool
    fields: list[str]
    workaround: str
    mitigation: SpecPatch | None
    given_detail: str | None  # a built-in check's detail; None: a rule's, described from `eff` when first read
    order: int
    rule: Rule | None = None
    advisory: bool = False  # a built-in check reported as an advisory (nothing in the spec to change)
    eff: Effective | None = None  # the configuration a rule matched (its detail describes it)
    #: it has a mitigation and that mitigation keeps speculative decoding on (a safe default; a fix to suggest)
    keeps_spec: bool = False

    def described_by(self, eff: Effective) -> Hit:
        """The same hit, its detail to be described from `eff` (a field-for-field copy: dataclasses.replace
        re-runs __init__, too slow for the admission hot path)."""
        new = object.__new__(Hit)
        new.__dict__.update(self.__dict__)
        new.given_detail = None
        new.eff = eff
        return new

    @property
    def detail(self) -> str:
        """What in the configuration makes the rule hold (for its message): built lazily, as most hits of the
        intermediate configurations of the defaults fixpoint are never reported."""
        if self.given_detail is None:
            if self.rule is None or self.eff is None:
                raise ValueError(f"hit {self.ref} has neither a detail nor a rule and configuration to describe")
            self.given_detail = _detail(self.rule, self.eff)
        return self.given_detail


def _versions_text(rule: Rule) -> str:
    if rule.versions.strip() in ("", "*"):
        return "all versions" + ("" if rule.fixed_in else ", no fix released")
    if rule.ends_in:
        return f"affects {rule.versions}, no fix released; cannot apply from {rule.ends_in}: {rule.ends_why}"
    fixed = f", fixed in {rule.fixed_in}" if rule.fixed_in else ", no fix released"
    return f"affects {rule.versions}{fixed}"


def match_rules(ruleset: RuleSet, eff: Effective) -> list[Hit]:
    hits = _builtin_hits(ruleset, eff)
    ver = eff.version
    if ver is None:
        return hits  # defaults cannot be resolved: no rule can be evaluated honestly
    v, vk = eff.values, ver.key
    rules = ruleset.rules
    for i in ruleset.in_range(vk):
        hit = _rule_hit(ruleset, i, rules[i], eff, v, vk)
        if hit is not None:
            hits.append(hit)
    return hits


def rematch(ruleset: RuleSet, eff: Effective, prev: Effective, prev_hits: list[Hit]) -> list[Hit]:
    """`match_rules(ruleset, eff)`, given the hits `prev_hits` of a configuration `prev` that differs from `eff`
    in a few values (a default or a mitigation applied): a rule that reads none of the changed values
    (Rule.reads) matches exactly as it did, so only the others are evaluated again (the built-in checks
    always are; a changed version matches everything again). The result equals match_rules'."""
    if eff.version is None or prev.version is None or eff.version.key != prev.version.key:
        return match_rules(ruleset, eff)
    v, pv = eff.values, prev.values
    changed = {k for k in ruleset.reads if v.get(k, _MISSING) != pv.get(k, _MISSING)}  # what no rule reads is moot
    same_builtins = all(v[k] == pv[k] for k in _BUILTIN_READS)  # the built-in checks hold as they did, details too
    hits = [h for h in prev_hits if h.rule is None] if same_builtins else _builtin_hits(ruleset, eff)
    before = {h.order: h for h in prev_hits if h.rule is not None}
    vk = eff.version.key
    rules = ruleset.rules
    for i in ruleset.in_range(vk):
        rule = rules[i]
        if not rule.reads.isdisjoint(changed):
            hit = _rule_hit(ruleset, i, rule, eff, v, vk)
        else:
            hit = before.get(i)
            if hit is not None:  # the same match; its message describes the fields as they are now
                hit = hit.described_by(eff)
        if hit is not None:
            hits.append(hit)
    return hits


_MISSING = object()
#: what the built-in checks read besides the version (its key is the same in `rematch`'s reuse): the version as
#: written, the model, the patch ids
_BUILTIN_READS = ("vllm_version", "gdn_hybrid", "model_name", "patches")


def _builtin_hits(ruleset: RuleSet, eff: Effective) -> list[Hit]:
    hits: list[Hit] = []
    v = eff.values
    ver = eff.version
    patches = v["patches"]
    builtin = ruleset.builtin

    if ver is None:
        b = builtin["unparseable-version"]
        hits.append(builtin_hit(b, f"spec.image.vllmVersion {v['vllm_version']!r} is not a vLLM version", -5))
        return hits
    if ver > ruleset.newest and ver.base != ruleset.newest.base:
        b = builtin["newer-than-catalogue"]
        hits.append(
            builtin_hit(
                b,
                f"vLLM {v['vllm_version']} is not in the catalogue (newest {ruleset.newest}), so the rules of "
                f"{ruleset.newest} were applied; {ruleset.unchecked(ver)}",
                -4,
            )
        )
    elif ver < ruleset.oldest:
        b = builtin["older-than-catalogue"]
        hits.append(builtin_hit(b, f"vLLM {v['vllm_version']} predates the catalogue (oldest {ruleset.oldest})", -4))
    if not v["gdn_hybrid"]:
        b = builtin["unrecognised-architecture"]
        hits.append(
            builtin_hit(
                b,
                f"model {v['model_name']!r} is not a recognised Qwen3-Next / Qwen3.5 / Qwen3.6 / Qwen3.8 "
                "name and spec.model.architecture is unset",
                -3,
            )
        )
    if not patches:
        return hits
    unknown = sorted(p for p in patches if p not in ruleset.patch_ids and p not in ruleset.planned_patch_ids)
    planned = sorted(p for p in patches if p in ruleset.planned_patch_ids)
    if unknown or planned:
        b = builtin["unknown-patch"]
        parts = []
        if unknown:
            parts.append(f"unknown patch id(s): {', '.join(unknown)}")
        if planned:
            parts.append(f"planned patch id(s) not shipped by any gdn-guard release, not relied on: {', '.join(planned)}")
        hits.append(builtin_hit(b, "; ".join(parts), -2))
    return hits


def _detail(rule: Rule, eff: Effective) -> str:
    because = "; ".join(d for d in dict.fromkeys(describe_field(eff, p) for p in rule.fields) if d)
    versions: str | None = rule.__dict__.get(_VERSIONS_TEXT)
    if versions is None:
        versions = rule.__dict__[_VERSIONS_TEXT] = _versions_text(rule)  # a memo outside the frozen fields, as _PROTO
    return f"{because} ({versions})"


_VERSIONS_TEXT = "_versions_text"


def _rule_hit(ruleset: RuleSet, i: int, rule: Rule, eff: Effective, v: dict[str, Any], vk: Any) -> Hit | None:
    """The rule's hit on `eff` (its version range already checked: RuleSet.in_range)."""
    shipped = ruleset.shipped_patches[i]
    if shipped and not shipped.isdisjoint(v["patches"]):
        return None  # neutralised by a shipped patch the image declares (checked at run time too)
    if not rule.compiled_when(v, vk):
        return None
    enforced = rule.action == "enforce" or (rule.compiled_escalate is not None and bool(rule.compiled_escalate(v, vk)))
    return _hit(rule, i, enforced, eff)


def _hit(rule: Rule, i: int, enforced: bool, eff: Effective) -> Hit:
    """The hit of rule `i` on `eff`: a field-for-field copy of the rule's prototype (Hit.__init__ per match was a
    fifth of matching's cost)."""
    proto: Hit | None = rule.__dict__.get(_PROTO)
    if proto is None or proto.order != i:
        proto = Hit(
            ref=rule.id,
            title=rule.title,
            kind=rule.kind,
            severity=rule.severity,
            enforced=False,
            fields=[],
            workaround=rule.workaround,
            mitigation=rule.mitigation_patch,
            given_detail=None,
            order=i,
            rule=rule,
            keeps_spec=bool(rule.mitigation_patch) and keeps_spec_decoding(rule.mitigation_patch or SpecPatch()),
        )
        rule.__dict__[_PROTO] = proto  # frozen model: a memo outside its fields (made once per rule)
    hit = object.__new__(Hit)
    hit.__dict__.update(proto.__dict__)
    hit.enforced, hit.fields, hit.eff = enforced, list(rule.fields), eff
    return hit


_PROTO = "_hit_prototype"


def builtin_hit(b: Builtin, detail: str, order: int) -> Hit:
    return Hit(
        ref=b.id,
        title=b.title,
        kind=b.kind,
        severity=b.severity,
        enforced=b.action == "enforce",
        fields=list(b.fields),
        workaround=b.workaround,
        mitigation=None,
        given_detail=detail,
        order=order,
        advisory=b.action == "advisory",
    )
