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

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gdn_operator.api.enums import ADMISSION_POLICIES
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.api.status import EffectiveConfig, RuleFinding
from gdn_operator.rules.cost import cost_findings, default_cost
from gdn_operator.rules.defaults import Default, resolve_defaults
from gdn_operator.rules.effective import Effective, LaunchOverrides, effective_config
from gdn_operator.rules.matching import Hit, match_rules
from gdn_operator.rules.rulefile import SEVERITY_RANK, RuleSet, load_rules

MAX_ROUNDS = 8
_ACTION_RANK = {"rejected": 0, "mitigated": 1, "warned": 2, "advisory": 3}

# Exit codes (gdnctl validate): admitted unchanged / rejected or changed by a mitigation.
EXIT_ADMITTED = 0
EXIT_REJECTED_OR_CHANGED = 1


@dataclass
class Evaluation:
    """The outcome of admission for one spec.

    `findings`        api.status.RuleFinding list, deterministic order (rejected, mitigated, warned,
                      advisory; then severity; then rule-file order).
    `defaults`        rules.defaults.Default per unset field the rules set (field, value, rule).
    `resolved_spec`   the spec with those defaults filled in (what runs unless mitigated).
    `allowed`         False when any finding is rejected.
    `mitigated_spec`  the spec after mitigations of values the user SET (None when nothing was changed or the
                      spec is refused); its defaults are filled in too.
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
    detail: Effective
    original_detail: Effective
    notes: list[str] = field(default_factory=list)
    defaults: list[Default] = field(default_factory=list)
    resolved_spec: GDNModelServerSpec | None = None
    ruleset: RuleSet | None = None  # the rules evaluated (what `effective` prices the defaults with)

    @functools.cached_property
    def effective(self) -> EffectiveConfig:
        """The status view of `detail` with the defaults and what each costs (rules/cost.py), built when first
        read: the reconciler writes it to status; admission never reads it."""
        ruleset = self.ruleset or load_rules()
        costs = {d.field: default_cost(ruleset, d.field, self.detail) for d in self.defaults}
        return self.detail.to_status(self.defaults, costs)

    @property
    def changed(self) -> bool:
        return self.mitigated_spec is not None

    @property
    def run_spec(self) -> GDNModelServerSpec | None:
        """What the engine runs (defaults filled in, mitigations applied); None when refused."""
        if not self.allowed:
            return None
        return self.mitigated_spec or self.resolved_spec

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
        """What the user can act on: a field they set and the value that avoids the risk."""
        return [f for f in self.findings if f.action == "warned"]

    @property
    def advisories(self) -> list[RuleFinding]:
        """Known risks no spec value avoids yet (reported once, in their own list)."""
        return [f for f in self.findings if f.action == "advisory"]

    def denial_message(self) -> str:
        """One text for the webhook denial: per rejected rule its id, what is wrong, the fields, the fix."""
        rej = self.rejected
        if not rej:
            return ""
        head = (
            f"GDNModelServer refused by {len(rej)} known-crash rule{'s' if len(rej) > 1 else ''} (admissionPolicy {self.policy}):"
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
        return "admitted with warnings" if self.warnings else "admitted"

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
            "defaults": [d.as_dict() for d in self.defaults],
            "effectiveDetail": self.detail.as_dict(),
            "patch": self.patch,
            "mitigatedSpec": self.mitigated_spec.dump() if self.mitigated_spec is not None else None,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------------


def _decide(hit: Hit, policy: str) -> str:
    """rejected / mitigated / warned / advisory for one hit under the policy (before mitigations are tried).
    An advisory rule is `warned` (actionable) when its mitigation names a value that avoids it with speculative
    decoding on, else an `advisory`: nothing in the spec avoids it yet."""
    if hit.advisory:
        return "advisory"
    if not hit.enforced and hit.rule is None:
        return "warned"  # a built-in check of spec input (e.g. a misspelt patch id): the user fixes it
    if not hit.enforced:
        return "warned" if hit.keeps_spec else "advisory"
    if policy == "reject":
        return "rejected"
    if policy == "mitigate":
        return "mitigated" if hit.mitigation else "rejected"
    # warn: silent corruption is never silently admitted
    if hit.kind == "silent-corruption":
        return "mitigated" if hit.mitigation else "rejected"
    return "warned"


def _finding(hit: Hit, action: str, extra: str = "") -> RuleFinding:
    fields = ", ".join(hit.fields)
    fix = hit.workaround
    if hit.mitigation and action != "advisory":
        fix += (
            f" Set {hit.mitigation.summary()}." if action == "warned" else f" Automatic mitigation: {hit.mitigation.summary()}."
        )
    message = f"{hit.ref}: {hit.title} — {hit.detail}. Fields: {fields}. Fix: {fix}"
    if extra:
        message += " " + extra
    return construct_finding(
        {
            "rule": hit.ref,
            "title": hit.title,
            "kind": hit.kind,
            "severity": hit.severity,
            "action": action,
            "message": message,
            "fields": list(hit.fields),
            "workaround": hit.workaround,
            "mitigation": hit.mitigation.as_dict() if hit.mitigation else None,
            "code": None,
            "measurements": None,
        }
    )


_FINDING_FIELDS = tuple(RuleFinding.model_fields)
_set_attr = object.__setattr__


def construct_finding(values: dict[str, Any]) -> RuleFinding:
    """`RuleFinding.model_construct(**values)` for `values` that give every field by its name (built here from the
    validated rule file: no re-validation on the admission hot path), without model_construct's per-field alias and
    default lookups (a third of a finding's cost; tests/rules/test_defaults_fast.py holds the two equal). The result
    is an ordinary api.status.RuleFinding."""
    if tuple(values) != _FINDING_FIELDS:
        raise ValueError(f"construct_finding needs exactly the fields {', '.join(_FINDING_FIELDS)}, in that order")
    m = RuleFinding.__new__(RuleFinding)
    _set_attr(m, "__dict__", values)
    _set_attr(m, "__pydantic_fields_set__", set(_FINDING_FIELDS))
    _set_attr(m, "__pydantic_extra__", None)  # extra="ignore", not a root model, no post-init (as model_construct)
    _set_attr(m, "__pydantic_private__", None)
    return m


# ----------------------------------------------------------------------------------- evaluate ---


def evaluate(
    spec: GDNModelServerSpec,
    *,
    default_policy: str = "reject",
    vllm_version: str | None = None,
    overrides: LaunchOverrides | None = None,
    policy: str | None = None,
    defaults: bool = True,
    ruleset: RuleSet | None = None,
    revalidate: bool = False,
) -> Evaluation:
    """Evaluate a validated spec. Never raises for a valid spec (ValueError only for a bad default_policy).

    `default_policy`: the operator-wide default when spec.admissionPolicy is unset.
    `vllm_version`:   overrides spec.image.vllmVersion (gdnctl --vllm-version).
    `overrides`:      launch-line facts a spec cannot hold (rules.launchline).
    `policy`:         force a policy regardless of spec.admissionPolicy (launch lines use "reject").
    `defaults`:       fill unset fields with the rules' safe values (rules/defaults.py); False for raw
                      launch lines, which run as written.
    `ruleset`:        another rule set than the packaged one (rules/compat.py's tests use a synthetic one).
    `revalidate`:     build every safe-defaults candidate by validating the whole spec again (rules/defaults.py:
                      the reference the tests hold the fast path to; same answer, slower).
    """
    if default_policy not in ADMISSION_POLICIES:
        raise ValueError(f"default_policy must be one of {', '.join(ADMISSION_POLICIES)}, got {default_policy!r}")
    ruleset = ruleset or load_rules()
    effective_policy = policy or spec.admission_policy or default_policy
    if effective_policy not in ADMISSION_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(ADMISSION_POLICIES)}, got {effective_policy!r}")
    return _evaluate(ruleset, spec, effective_policy, vllm_version, overrides, defaults, revalidate)


def _evaluate(
    ruleset: RuleSet,
    spec: GDNModelServerSpec,
    policy: str,
    vllm_version: str | None,
    overrides: LaunchOverrides | None,
    use_defaults: bool = True,
    revalidate: bool = False,
) -> Evaluation:
    if use_defaults:
        res = resolve_defaults(ruleset, spec, vllm_version, overrides, revalidate=revalidate)
        resolved, defaults, eff0, hits0 = res.spec, res.defaults, res.effective, res.hits
    else:
        resolved, defaults = spec, []
        eff0 = effective_config(spec, vllm_version, overrides=overrides)
        hits0 = match_rules(ruleset, eff0)
    decisions0 = [(h, _decide(h, policy)) for h in hits0]

    if not any(a == "mitigated" for _, a in decisions0):
        findings = [_finding(h, a) for h, a in decisions0]
        return _result(ruleset, policy, findings, None, SpecPatch(), [], eff0, eff0, defaults, resolved)

    # ---- mitigation loop: one mitigation per round, most severe first, to a fixed point ---------
    # Each round changes the USER's values (original + mitigations so far), then resolves the defaults again:
    # a mitigation that unsets a field gets that field's safe default, as the same spec submitted would.
    original = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
    current_dict = original
    current_spec = resolved
    eff = eff0
    applied: list[Hit] = []
    change = SpecPatch()
    failed: dict[str, str] = {}
    seen_states = [_state_key(resolved)]
    decisions = decisions0
    run_defaults = defaults

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
            if use_defaults:
                res = resolve_defaults(ruleset, cand_spec, vllm_version, overrides, revalidate=revalidate)
                cand_spec, cand_defaults, cand_eff, cand_hits = res.spec, res.defaults, res.effective, res.hits
            else:
                cand_defaults = []
                cand_eff = effective_config(cand_spec, vllm_version, overrides=overrides)
                cand_hits = match_rules(ruleset, cand_eff)
            key = _state_key(cand_spec)
            if key in seen_states:
                failed[hit.ref] = "its mitigation would undo an earlier one (loop)"
                continue
            cand_dec = [(h, _decide(h, policy)) for h in cand_hits]
            newly_rejected = [
                h.ref
                for h, a in cand_dec
                if a == "rejected" and not any(h.ref == h0.ref and a0 == "rejected" for h0, a0 in decisions)
            ]
            if newly_rejected:
                failed[hit.ref] = f"its mitigation would trigger {', '.join(newly_rejected)}"
                continue
            # accept this mitigation
            applied.append(hit)
            change = change + mitigation
            current_dict, current_spec, eff, decisions = candidate, cand_spec, cand_eff, cand_dec
            run_defaults = cand_defaults
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
        return _result(ruleset, policy, rest, None, SpecPatch(), [], eff0, eff0, defaults, resolved)
    if not allowed:
        # refused anyway: nothing is changed; report the rules that wanted a change as rejected, against
        # the configuration as submitted
        refused = [_finding(hit, "rejected", "Mitigation not applied: the spec is refused by another rule.") for hit in applied]
        return _result(ruleset, policy, refused + rest, None, SpecPatch(), [], eff0, eff0, defaults, resolved)
    findings = [_finding(hit, "mitigated", f"Applied: {(hit.mitigation or SpecPatch()).summary()}.") for hit in applied] + rest
    return _result(
        ruleset, policy, findings, current_spec, change, change.json_patch(original), eff, eff0, run_defaults, resolved
    )


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
    defaults: list[Default],
    resolved: GDNModelServerSpec,
) -> Evaluation:
    allowed = not any(f.action == "rejected" for f in findings)
    if allowed:  # what the admitted configuration measurably costs (rules/cost.py): advisories, never warnings
        origins = {d.field: "defaulted" for d in defaults} | {p: "applied by admission" for p, _ in change.changes}
        findings = findings + cost_findings(ruleset, eff, origins)
    # de-duplicate by (rule, action, code), keep the first
    seen = set()
    uniq = []
    for f in findings:
        k = (f.rule, f.action, f.code)
        if k not in seen:
            seen.add(k)
            uniq.append(f)
    order = ruleset.order
    uniq.sort(key=lambda f: (_ACTION_RANK.get(f.action, 9), SEVERITY_RANK.get(f.severity, 9), order.get(f.rule, 999), f.rule))
    notes = list(dict.fromkeys(eff0.notes + eff.notes))
    return Evaluation(
        findings=uniq,
        allowed=allowed,
        policy=policy,
        mitigated_spec=mitigated,
        change=change,
        patch=patch,
        detail=eff,
        original_detail=eff0,
        notes=notes,
        defaults=defaults,
        resolved_spec=resolved,
        ruleset=ruleset,
    )
