"""Safe defaults: what an UNSET spec field resolves to, computed by the rules themselves.

Unset means safe. A field the user left unset is the operator's choice, so it takes the value the
known-issue rules accept for that vLLM version and patch set, keeping speculative decoding on:

1. resolve the configuration (rules/effective.py) and match the rules (rules/matching.py);
2. among the matches with a mitigation (rules/data/rules.yaml `mitigation`), take those whose every
   mitigated field is unset in the user's spec, that keep speculative decoding on, and that change
   something; the most severe first (enforced rules before advisories, then severity, then file order);
3. apply the first whose result validates and matches no enforced rule that did not match before
   (a default never creates a rejection); record {field, value, rule} for each field it sets;
4. repeat until no candidate is left (a fixed point; each field is defaulted at most once, so it ends).

There is no second table: the values are the rules' own mitigations. Wherever no rule objects, the
field stays unset and vLLM's own default applies (nothing is rendered for it). A value the user SETS
is never defaulted: the admission policy judges it (rules/evaluator.py). Raw launch lines are not
defaulted (what they say is what runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch, user_set
from gdn_operator.rules.effective import Effective, LaunchOverrides, effective_config
from gdn_operator.rules.matching import Hit, match_rules, rematch
from gdn_operator.rules.rulefile import SEVERITY_RANK, RuleSet


@dataclass(frozen=True)
class Default:
    """One unset field and the value the rules chose for it."""

    field: str  # camelCase spec path, e.g. prefixCaching
    value: Any
    rule: str  # the rule whose mitigation it is, e.g. vllm#43559

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "rule": self.rule}


@dataclass
class Resolved:
    """The spec with its defaults filled in, and the configuration it resolves to."""

    spec: GDNModelServerSpec
    defaults: list[Default]
    effective: Effective
    hits: list[Hit]


def _enforced(hits: list[Hit]) -> set[str]:
    return {h.ref for h in hits if h.enforced}


def _all_unset(spec: GDNModelServerSpec, m: SpecPatch, done: set[str], unset: dict[str, bool]) -> bool:
    """Whether every path `m` changes is neither defaulted yet (`done`) nor set by the user (`unset` remembers
    user_set's answer per path)."""
    for p, _ in m.changes:
        if p in done:
            return False
        free = unset.get(p)
        if free is None:
            free = unset[p] = not user_set(spec, p)
        if not free:
            return False
    return True


def resolve_defaults(
    ruleset: RuleSet,
    spec: GDNModelServerSpec,
    vllm_version: str | None = None,
    overrides: LaunchOverrides | None = None,
    *,
    revalidate: bool = False,
) -> Resolved:
    """`spec` with every unset field a matching rule objects to set to that rule's mitigation.

    Each candidate is built with `SpecPatch.apply_model` (the changed fields validated, the rest of the spec
    kept: admission's hot path); `revalidate=True` builds it as before, the user's values plus the defaults so far
    dumped, changed and validated whole (the reference the property tests hold the fast path to)."""
    eff = effective_config(spec, vllm_version, overrides=overrides)
    hits = match_rules(ruleset, eff)
    if eff.version is None:
        return Resolved(spec, [], eff, hits)
    current: dict[str, Any] | None = None  # revalidate: the user's values plus the defaults so far (dumped once)
    cur_spec = spec
    defaults: list[Default] = []
    done: set[str] = set()  # fields defaulted: each at most once, so this ends
    failed: set[str] = set()  # rules whose mitigation could not be a default
    unset: dict[str, bool] = {}  # path -> the user left it unset (user_set, asked once per path)
    while True:
        candidates: list[tuple[Hit, SpecPatch]] = []  # with the changes the spec does not have yet
        for h in hits:
            m = h.mitigation
            if m is None or not h.keeps_spec or h.ref in failed:
                continue
            if not _all_unset(spec, m, done, unset):
                continue
            if revalidate and current is None:
                current = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
            pending = m.pending(current) if current is not None else m.pending_in(cur_spec)
            if not pending:
                continue
            candidates.append((h, pending))
        if not candidates:
            break
        candidates.sort(key=lambda c: (not c[0].enforced, SEVERITY_RANK.get(c[0].severity, 9), c[0].order))
        before = _enforced(hits)
        progressed = False
        for h, pending in candidates:
            m = h.mitigation or SpecPatch()
            failed.add(h.ref)  # taken back below when it is applied
            cand = m.apply_shared(current) if current is not None else None  # read-only: validated, then `current`
            try:
                cand_spec = GDNModelServerSpec.model_validate(cand) if cand is not None else m.apply_model(cur_spec)
            except ValidationError:
                continue
            cand_eff = effective_config(cand_spec, vllm_version, overrides=overrides)
            cand_hits = rematch(ruleset, cand_eff, eff, hits)  # only the rules that read what changed
            if _enforced(cand_hits) - before:
                continue  # a default never creates a rejection
            failed.discard(h.ref)
            done.update(p for p, _ in m.changes)
            defaults.extend(Default(p, v, h.ref) for p, v in pending.changes)
            current, cur_spec, eff, hits = cand, cand_spec, cand_eff, cand_hits
            progressed = True
            break
        if not progressed:
            break
    return Resolved(cur_spec, defaults, eff, hits)
