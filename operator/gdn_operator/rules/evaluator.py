"""Admission evaluation of a GDNModelServerSpec against the known-crash rules.

    from gdn_operator.rules import evaluate
    ev = evaluate(spec, default_policy="reject")
    if not ev.allowed: raise kopf.AdmissionError(ev.denial_message())
    ev.change                   # the mitigations as one api.specpatch.SpecPatch (empty unless mitigated)
    ev.merge_patch()            # ... as the merge patch for .spec the mutating webhook sends
    status_findings = ev.findings, status_effective = ev.effective

Policy (spec.admissionPolicy, else the operator-wide `default_policy`), for a rule whose action is
`enforce`:

* ``reject``   — the finding is `rejected`;
* ``mitigate`` — the rule's mitigation is applied (`mitigated`); a rule without one is `rejected`;
* ``warn``     — `warned`; except silent-corruption rules, which are never silently admitted: mitigated
  when they have a mitigation, rejected otherwise.

Rules with `action: warn` (advisory) are `warned` under every policy unless their `escalate_if`
predicate holds. Mitigations are applied one at a time (most severe rule first) and the spec is
re-evaluated until no enforced rule wants a change (a fixed point), at most MAX_ROUNDS times; a
mitigation that leads to a rejected finding, a loop or an invalid spec is not applied and its rule is
rejected instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gdn_operator.api.enums import ADMISSION_POLICIES
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.api.status import EffectiveConfig, RuleFinding
from gdn_operator.rules.rulefile import SEVERITY_RANK, Builtin, RuleSet, Rule, load_rules
from gdn_operator.rules.effective import Effective, LaunchOverrides, describe_field, effective_config

MAX_ROUNDS = 8
_ACTION_RANK = {"rejected": 0, "mitigated": 1, "warned": 2}

# Exit codes (gdnctl validate): admitted unchanged / rejected or changed by a mitigation.
EXIT_ADMITTED = 0
EXIT_REJECTED_OR_CHANGED = 1


@dataclass
class Evaluation:
    """The outcome of admission for one spec.

    `findings`        api.status.RuleFinding list, deterministic order (rejected, mitigated, warned; then
                      severity; then rule-file order).
    `allowed`         False when any finding is rejected.
    `mitigated_spec`  the spec after mitigations (None when nothing was changed or the spec is refused).
    `change`          the applied mitigations, in order, as one SpecPatch (empty unless mitigated).
    `patch`           `change` as RFC 6902 ops against the spec as submitted (paths /spec/...).
    `effective`       api.status.EffectiveConfig of what will run (the mitigated spec when mitigated).
    `detail`          the full resolved configuration (rules.effective.Effective) behind `effective`.
    `policy`          the policy that was applied.
    `notes`           informational lines (deprecated aliases, defaults assumed, ignored launch flags).
    """

    findings: list[RuleFinding]
    allowed: bool
    policy: str
    mitigated_spec: GDNModelServerSpec | None
    change: SpecPatch
    patch: list[dict[str, Any]]
    effective: EffectiveConfig
    detail: Effective
    original_detail: Effective
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.mitigated_spec is not None

    def merge_patch(self) -> dict[str, Any]:
        """The mitigations as an RFC 7386 merge patch for .spec ({} unless mitigated)."""
        return self.change.merge_patch() if self.changed else {}

    @property
    def exit_code(self) -> int:
        """0: admitted unchanged (warnings allowed); 1: rejected or changed by a mitigation."""
        return EXIT_ADMITTED if self.allowed and not self.changed else EXIT_REJECTED_OR_CHANGED

    @property
    def rejected(self) -> list[RuleFinding]:
        return [f for f in self.findings if f.action == "rejected"]

    @property
    def mitigated(self) -> list[RuleFinding]:
        return [f for f in self.findings if f.action == "mitigated"]

    @property
    def warnings(self) -> list[RuleFinding]:
        return [f for f in self.findings if f.action == "warned"]

    def denial_message(self) -> str:
        """One text for the webhook denial: per rejected rule its id, what is wrong, the fields, the fix."""
        rej = self.rejected
        if not rej:
            return ""
        head = (
            f"GDNModelServer refused by {len(rej)} known-crash rule{'s' if len(rej) > 1 else ''} "
            f"(admissionPolicy {self.policy}):"
        )
        lines = [head]
        for f in rej:
            lines.append(f"- {f.message}")
        return "\n".join(lines)

    def summary(self) -> str:
        if not self.allowed:
            return "rejected"
        if self.changed:
            return "mitigated"
        return "admitted with warnings" if self.findings else "admitted"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape (gdnctl validate --output json)."""
        return {
            "allowed": self.allowed,
            "changed": self.changed,
            "result": self.summary(),
            "policy": self.policy,
            "exitCode": self.exit_code,
            "findings": [f.model_dump(by_alias=True, mode="json") for f in self.findings],
            "effective": self.effective.model_dump(by_alias=True, mode="json"),
            "effectiveDetail": self.detail.as_dict(),
            "patch": self.patch,
            "mitigatedSpec": self.mitigated_spec.dump() if self.mitigated_spec is not None else None,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------------


@dataclass
class _Hit:
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


def _versions_text(rule: Rule) -> str:
    if rule.versions.strip() in ("", "*"):
        return "all versions" + ("" if rule.fixed_in else ", no fix released")
    fixed = f", fixed in {rule.fixed_in}" if rule.fixed_in else ", no fix released"
    return f"affects {rule.versions}{fixed}"


def _match_rules(ruleset: RuleSet, eff: Effective) -> list[_Hit]:
    hits: list[_Hit] = []
    v = eff.values
    ver = eff.version
    patches = v["patches"]
    builtin = ruleset.builtin

    if ver is None:
        b = builtin["unparseable-version"]
        hits.append(_builtin_hit(b, f"spec.image.vllmVersion {v['vllm_version']!r} is not a vLLM version", -5))
        return hits  # defaults cannot be resolved: no rule can be evaluated honestly
    if ver > ruleset.newest and ver.base != ruleset.newest.base:
        b = builtin["newer-than-catalogue"]
        hits.append(_builtin_hit(b, f"vLLM {v['vllm_version']} is not in the catalogue (newest {ruleset.newest}); "
                                    "open bugs assumed still present", -4))
    elif ver < ruleset.oldest:
        b = builtin["older-than-catalogue"]
        hits.append(_builtin_hit(b, f"vLLM {v['vllm_version']} predates the catalogue (oldest {ruleset.oldest})", -4))
    if not v["gdn_hybrid"]:
        b = builtin["unrecognised-architecture"]
        hits.append(_builtin_hit(b, f"model {v['model_name']!r} is not a recognised Qwen3-Next / Qwen3.5 / Qwen3.6 / Qwen3.8 "
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
        hits.append(_builtin_hit(b, "; ".join(parts), -2))

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
            _Hit(
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


def _builtin_hit(b: Builtin, detail: str, order: int) -> _Hit:
    return _Hit(
        ref=b.id, title=b.title, kind=b.kind, severity=b.severity, enforced=b.action == "enforce",
        fields=list(b.fields), workaround=b.workaround, mitigation=None, detail=detail, order=order,
    )


def _decide(hit: _Hit, policy: str) -> str:
    """rejected / mitigated / warned for one hit under the policy (before mitigations are tried)."""
    if not hit.enforced:
        return "warned"
    if policy == "reject":
        return "rejected"
    if policy == "mitigate":
        return "mitigated" if hit.mitigation else "rejected"
    # warn: silent corruption is never silently admitted
    if hit.kind == "silent-corruption":
        return "mitigated" if hit.mitigation else "rejected"
    return "warned"


def _finding(hit: _Hit, action: str, extra: str = "") -> RuleFinding:
    fields = ", ".join(hit.fields)
    fix = hit.workaround
    if hit.mitigation:
        fix += f" Automatic mitigation: {hit.mitigation.summary()}."
    message = f"{hit.ref}: {hit.title} — {hit.detail}. Fields: {fields}. Fix: {fix}"
    if extra:
        message += " " + extra
    # model_construct: every value is built here from the validated rule file (no re-validation on
    # the admission hot path); the result is an ordinary api.status.RuleFinding
    return RuleFinding.model_construct(
        rule=hit.ref,
        title=hit.title,
        kind=hit.kind,
        severity=hit.severity,
        action=action,
        message=message,
        fields=list(hit.fields),
        workaround=hit.workaround,
        mitigation=hit.mitigation.as_dict() if hit.mitigation else None,
    )


def _sort_key(ruleset: RuleSet, f: RuleFinding, order: dict[str, int]) -> tuple:
    return (_ACTION_RANK.get(f.action, 9), SEVERITY_RANK.get(f.severity, 9), order.get(f.rule, 999), f.rule)


# ----------------------------------------------------------------------------------- evaluate ---


def evaluate(
    spec: GDNModelServerSpec,
    *,
    default_policy: str = "reject",
    vllm_version: str | None = None,
    overrides: LaunchOverrides | None = None,
    policy: str | None = None,
) -> Evaluation:
    """Evaluate a validated spec. Never raises for a valid spec (ValueError only for a bad default_policy).

    `default_policy`: the operator-wide default when spec.admissionPolicy is unset.
    `vllm_version`:   overrides spec.image.vllmVersion (gdnctl --vllm-version).
    `overrides`:      launch-line facts a spec cannot hold (rules.launchline).
    `policy`:         force a policy regardless of spec.admissionPolicy (launch lines use "reject").
    """
    if default_policy not in ADMISSION_POLICIES:
        raise ValueError(f"default_policy must be one of {', '.join(ADMISSION_POLICIES)}, got {default_policy!r}")
    ruleset = load_rules()
    effective_policy = policy or spec.admission_policy or default_policy
    if effective_policy not in ADMISSION_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(ADMISSION_POLICIES)}, got {effective_policy!r}")
    return _evaluate(ruleset, spec, effective_policy, vllm_version, overrides)


def _evaluate(
    ruleset: RuleSet,
    spec: GDNModelServerSpec,
    policy: str,
    vllm_version: str | None,
    overrides: LaunchOverrides | None,
) -> Evaluation:
    eff0 = effective_config(spec, vllm_version, overrides=overrides)
    hits0 = _match_rules(ruleset, eff0)
    decisions0 = [(h, _decide(h, policy)) for h in hits0]

    if not any(a == "mitigated" for _, a in decisions0):
        findings = [_finding(h, a) for h, a in decisions0]
        return _result(ruleset, policy, findings, None, SpecPatch(), [], eff0, eff0)

    # ---- mitigation loop: one mitigation per round, most severe first, to a fixed point ---------
    original = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
    current_dict = original
    current_spec = spec
    eff = eff0
    applied: list[_Hit] = []
    change = SpecPatch()
    failed: dict[str, str] = {}
    seen_states = [_state_key(spec)]
    decisions = decisions0

    for _round in range(MAX_ROUNDS):
        wanting = [h for h, a in decisions if a == "mitigated" and h.ref not in failed]
        if not wanting:
            break
        wanting.sort(key=lambda h: (SEVERITY_RANK.get(h.severity, 9), h.order))
        progressed = False
        for hit in wanting:
            mitigation = hit.mitigation or SpecPatch()
            candidate = mitigation.apply(current_dict)
            try:
                cand_spec = GDNModelServerSpec.model_validate(candidate)
            except ValidationError as e:
                failed[hit.ref] = f"its mitigation gives an invalid spec ({e.error_count()} error(s))"
                continue
            key = _state_key(cand_spec)
            if key in seen_states:
                failed[hit.ref] = "its mitigation would undo an earlier one (loop)"
                continue
            cand_eff = effective_config(cand_spec, vllm_version, overrides=overrides)
            cand_hits = _match_rules(ruleset, cand_eff)
            cand_dec = [(h, _decide(h, policy)) for h in cand_hits]
            newly_rejected = [
                h.ref for h, a in cand_dec
                if a == "rejected" and not any(h.ref == h0.ref and a0 == "rejected" for h0, a0 in decisions)
            ]
            if newly_rejected:
                failed[hit.ref] = f"its mitigation would trigger {', '.join(newly_rejected)}"
                continue
            # accept this mitigation
            applied.append(hit)
            change = change + mitigation
            current_dict, current_spec, eff, decisions = candidate, cand_spec, cand_eff, cand_dec
            seen_states.append(key)
            progressed = True
            break
        if not progressed:
            break
    else:
        for h, a in decisions:
            if a == "mitigated" and h.ref not in failed:
                failed[h.ref] = f"mitigations did not converge in {MAX_ROUNDS} rounds"

    failed_any = False
    rest: list[RuleFinding] = []
    for h, a in decisions:
        if a == "mitigated":
            reason = failed.get(h.ref, "no applicable mitigation")
            rest.append(_finding(h, "rejected", f"Not mitigated: {reason}."))
            failed_any = True
        else:
            rest.append(_finding(h, a))
    # hits that could not be mitigated in an earlier round but were resolved by a later change are gone

    allowed = not failed_any and not any(f.action == "rejected" for f in rest)
    if not applied:
        return _result(ruleset, policy, rest, None, SpecPatch(), [], eff0, eff0)
    if not allowed:
        # refused anyway: nothing is changed; report the rules that wanted a change as rejected, against
        # the configuration as submitted
        refused = [
            _finding(hit, "rejected", "Mitigation not applied: the spec is refused by another rule.")
            for hit in applied
        ]
        return _result(ruleset, policy, refused + rest, None, SpecPatch(), [], eff0, eff0)
    findings = [_finding(hit, "mitigated", f"Applied: {(hit.mitigation or SpecPatch()).summary()}.") for hit in applied] + rest
    return _result(ruleset, policy, findings, current_spec, change, change.json_patch(original), eff, eff0)


def _state_key(spec: GDNModelServerSpec) -> str:
    """Semantic identity of a spec (defaults included, so unset == its default)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True)


def _result(
    ruleset: RuleSet,
    policy: str,
    findings: list[RuleFinding],
    mitigated: GDNModelServerSpec | None,
    change: SpecPatch,
    patch: list[dict[str, Any]],
    eff: Effective,
    eff0: Effective,
) -> Evaluation:
    # de-duplicate by (rule, action), keep the first
    seen = set()
    uniq = []
    for f in findings:
        k = (f.rule, f.action)
        if k not in seen:
            seen.add(k)
            uniq.append(f)
    order = ruleset.order
    uniq.sort(key=lambda f: _sort_key(ruleset, f, order))
    allowed = not any(f.action == "rejected" for f in uniq)
    notes = list(dict.fromkeys(eff0.notes + eff.notes))
    return Evaluation(
        findings=uniq,
        allowed=allowed,
        policy=policy,
        mitigated_spec=mitigated,
        change=change,
        patch=patch,
        effective=eff.to_status(),
        detail=eff,
        original_detail=eff0,
        notes=notes,
    )
