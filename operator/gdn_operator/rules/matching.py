"""Matching: which rules and built-in checks hold for a resolved configuration (rules.effective.Effective),
before any admission policy is applied. Shared by the evaluator (rules/evaluator.py) and the safe
defaults (rules/defaults.py), so both read the rules the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.rules.effective import Effective, describe_field
from gdn_operator.rules.rulefile import Builtin, Rule, RuleSet


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
    detail: str
    order: int
    rule: Rule | None = None
    advisory: bool = False  # a built-in check reported as an advisory (nothing in the spec to change)


def _versions_text(rule: Rule) -> str:
    if rule.versions.strip() in ("", "*"):
        return "all versions" + ("" if rule.fixed_in else ", no fix released")
    fixed = f", fixed in {rule.fixed_in}" if rule.fixed_in else ", no fix released"
    return f"affects {rule.versions}{fixed}"


def match_rules(ruleset: RuleSet, eff: Effective) -> list[Hit]:
    hits: list[Hit] = []
    v = eff.values
    ver = eff.version
    patches = v["patches"]
    builtin = ruleset.builtin

    if ver is None:
        b = builtin["unparseable-version"]
        hits.append(builtin_hit(b, f"spec.image.vllmVersion {v['vllm_version']!r} is not a vLLM version", -5))
        return hits  # defaults cannot be resolved: no rule can be evaluated honestly
    if ver > ruleset.newest and ver.base != ruleset.newest.base:
        b = builtin["newer-than-catalogue"]
        hits.append(builtin_hit(b, f"vLLM {v['vllm_version']} is not in the catalogue (newest {ruleset.newest}); "
                                    "open bugs assumed still present", -4))
    elif ver < ruleset.oldest:
        b = builtin["older-than-catalogue"]
        hits.append(builtin_hit(b, f"vLLM {v['vllm_version']} predates the catalogue (oldest {ruleset.oldest})", -4))
    if not v["gdn_hybrid"]:
        b = builtin["unrecognised-architecture"]
        hits.append(builtin_hit(b, f"model {v['model_name']!r} is not a recognised Qwen3-Next / Qwen3.5 / Qwen3.6 / Qwen3.8 "
                                    "name and spec.model.architecture is unset", -3))
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

    vk = ver.key
    for i, rule in enumerate(ruleset.rules):
        if not rule.range.contains(ver):
            continue
        if rule.patches and any(p in patches and p in ruleset.patch_ids for p in rule.patches):
            continue  # neutralised by a shipped patch the image declares (checked at run time too)
        if not rule.compiled_when(v, vk):
            continue
        enforced = rule.action == "enforce" or (
            rule.compiled_escalate is not None and bool(rule.compiled_escalate(v, vk))
        )
        because = "; ".join(d for d in dict.fromkeys(describe_field(eff, p) for p in rule.fields) if d)
        hits.append(
            Hit(
                ref=rule.id,
                title=rule.title,
                kind=rule.kind,
                severity=rule.severity,
                enforced=enforced,
                fields=list(rule.fields),
                workaround=rule.workaround,
                mitigation=rule.mitigation_patch,
                detail=f"{because} ({_versions_text(rule)})",
                order=i,
                rule=rule,
            )
        )
    return hits


def builtin_hit(b: Builtin, detail: str, order: int) -> Hit:
    return Hit(
        ref=b.id, title=b.title, kind=b.kind, severity=b.severity, enforced=b.action == "enforce",
        fields=list(b.fields), workaround=b.workaround, mitigation=None, detail=detail, order=order,
        advisory=b.action == "advisory",
    )
