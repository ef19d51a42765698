"""The measured cost of the rules' mitigations: the advisory MTPSlowerThanOff.

A rule's `cost` entries (rules/data/rules.yaml; schema: rules/rulefile.py `Cost`) are GPU captures of MTP
with the rule's mitigation against MTP off (vLLM's defaults), at a few concurrencies, each tied to its fixture
by tests/rules/test_mtp_cost.py. `cost_findings` turns them into one advisory per rule
(api.status.RuleFinding, action `advisory`: status.advisories, gdnctl validate / render), where

* a representative entry COVERS the server: it runs MTP at the entry's vLLM release and its effective values
  equal the entry's `config` (which holds the mitigation). However the server came to run the mitigation
  (a default, the user's own value, an admission mitigation, an operator override) it is in the effective
  configuration, so all are covered alike;
* and the mitigated MTP measured slower than MTP off (vs_off < 1) at some concurrency. Code
  ``MTPSlowerThanOff`` when such a concurrency is within the server's maxNumSeqs (spec.maxNumSeqs, else vLLM's
  default), ``MTPSlowerOnlyAboveMaxNumSeqs`` when every loss was measured above it (outside its range).

Never a warning and never a change: the mitigation stays (it avoids a defect); the advisory says what it
costs and what the user can do (fewer requests per engine, accept it, or MTP off). A release or a
configuration no entry measured gets nothing: unmeasured is not reported as a loss.
"""

from __future__ import annotations

from collections.abc import Mapping

from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.api.status import MeasuredCost, RuleFinding
from gdn_operator.rules.effective import Effective
from gdn_operator.rules.rulefile import Cost, Rule, RuleSet

SLOWER = "MTPSlowerThanOff"
SLOWER_ABOVE_RANGE = "MTPSlowerOnlyAboveMaxNumSeqs"


def covers(cost: Cost, eff: Effective) -> bool:
    """Whether the measurement `cost` is of this server's configuration (release, MTP, every `config` value)."""
    v = eff.values
    if eff.version is None or not v.get("mtp") or eff.version != cost.version:
        return False
    return all(k in v and v[k] == want for k, want in cost.config.items())


def _x(r: float) -> str:
    return f"{r:.2f}x"


def basis_text(c: Cost) -> str:
    """How an entry's ratios were obtained, where not by measuring trained engines: projected from step costs at a
    real geometry (dummy weights) at the acceptance it names."""
    if c.acceptance is None:
        return ""
    rates = " / ".join(f"{a:g}" for a in c.acceptance.per_position)
    return f"; projected from step costs at per-position acceptance {rates} ({c.acceptance.source})"


def _finding(rule: Rule, entries: list[Cost], eff: Effective, origin: str) -> RuleFinding | None:
    bound = int(eff.values["max_num_seqs"])
    measured: list[MeasuredCost] = []
    curves: list[str] = []
    for c in entries:
        lost = [p for p in c.points if p.vs_off < 1.0]
        if not lost:
            continue
        curves.append(
            f"{' / '.join(_x(p.vs_off) for p in c.points)} at concurrency {' / '.join(str(p.concurrency) for p in c.points)} "
            f"on {c.model}, {c.hardware}, TP={c.config.get('tensor_parallel_size', '?')}, vLLM {c.vllm} ({c.fixture}"
            f"{basis_text(c)})"
        )
        measured += [
            MeasuredCost.model_construct(
                vllm_version=c.vllm,
                hardware=c.hardware,
                model=c.model,
                tensor_parallel_size=c.config.get("tensor_parallel_size"),
                concurrency=p.concurrency,
                mtp_vs_off=p.vs_off,
                mtp_vs_unmitigated=p.vs_unmitigated,
                above_max_num_seqs=p.concurrency > bound,
                fixture=c.fixture,
            )
            for p in lost
        ]
    if not measured:
        return None
    inside = [m for m in measured if not m.above_max_num_seqs]
    code = SLOWER if inside else SLOWER_ABOVE_RANGE
    mitigation = (rule.mitigation_patch or SpecPatch()).summary()
    worst = min(inside or measured, key=lambda m: m.mtp_vs_off)
    lowest = min(m.concurrency for m in (inside or measured))
    src = eff.sources.get("max_num_seqs", "spec.maxNumSeqs")
    if inside:
        where = (
            f"This server's maxNumSeqs {bound} ({src}) admits that load: MTP with {mitigation} measured "
            f"{_x(worst.mtp_vs_off)} MTP off at concurrency {worst.concurrency}."
        )
    else:
        where = (
            f"Every measured loss (concurrency {', '.join(sorted({str(m.concurrency) for m in measured}, key=int))}) "
            f"is above this server's maxNumSeqs {bound} ({src}): outside the range it serves, as far as measured."
        )
    message = (
        f"{code}: {rule.id}'s mitigation {mitigation} ({origin}) measured slower than MTP off at high concurrency. "
        f"MTP with it / MTP off (tokens/s): {'; '.join(curves)}. {where}"
    )
    keep = f"The mitigation stays: it avoids {rule.id} ({rule.title})."
    if inside:
        workaround = (
            f"{keep} If the engines serve {lowest} or more requests at once: fewer per engine (spec.maxNumSeqs below "
            f"{lowest}, more replicas), or accept the cost, or turn MTP off (speculativeDecoding.enabled: false), "
            "faster there on the measured model."
        )
    else:
        workaround = f"{keep} Nothing to do while spec.maxNumSeqs stays below {lowest}."
    return RuleFinding.model_construct(
        rule=rule.id,
        title="MTP with this rule's mitigation measured slower than MTP off",
        kind="performance",
        severity="info",
        action="advisory",
        message=f"{message} What to do: {workaround}",
        fields=["spec.maxNumSeqs", "spec.speculativeDecoding", *(f"spec.{p}" for p in rule.mitigation or {})],
        workaround=workaround,
        mitigation=None,
        code=code,
        measurements=measured,
    )


def costs_of_field(ruleset: RuleSet, field: str, eff: Effective) -> list[tuple[Rule, Cost]]:
    """The representative measurements covering `eff` of every rule whose mitigation sets `field` (a camelCase
    spec path): what the value the rules chose for it costs. Two rules can ask for the same value: a default
    names one, its measurement may sit on the other."""
    return [
        (rule, c)
        for rule in ruleset.costed
        if field in (rule.mitigation or {})
        for c in rule.cost
        if c.representative and covers(c, eff)
    ]


def default_cost(ruleset: RuleSet, field: str, eff: Effective) -> str:
    """status.effective.defaults[].cost: the measured cost of a value the rules chose, or "unmeasured" -- with,
    where a rule asking for that value was run on a GPU at another release, what it cost there (and whether
    the defect showed), named with that release."""
    found = costs_of_field(ruleset, field, eff)
    if found:
        return "; ".join(
            f"MTP with it {' / '.join(_x(p.vs_off) for p in c.points)} of MTP off at concurrency "
            f"{' / '.join(str(p.concurrency) for p in c.points)} (vLLM {c.vllm}, {c.hardware}, {c.model.split(' ', 1)[0]}, "
            f"TP={c.config.get('tensor_parallel_size', '?')}; {rule.id} cost in rules.yaml, {c.fixture}{basis_text(c)})"
            for rule, c in found
        )
    text = f"unmeasured at vLLM {eff.values.get('vllm_version')} for this configuration"
    seen: set[str] = set()
    for rule in ruleset.rules:
        if field not in (rule.mitigation or {}):
            continue
        for r in rule.reproductions:
            if r.default_cost is None or r.default_cost in seen:
                continue
            seen.add(r.default_cost)
            shown = "reproduced" if r.reproduced else "not reproduced"
            text += (
                f"; at vLLM {r.vllm} ({r.hardware.split(' (', 1)[0]}, {r.model.split(' ', 1)[0]}, "
                f"TP={r.tensor_parallel_size}): {r.default_cost} "
                f"({rule.id} {shown} there, {r.fixture})"
            )
    return text


def cost_findings(ruleset: RuleSet, eff: Effective, origins: Mapping[str, str] | None = None) -> list[RuleFinding]:
    """The measured-cost advisories for the configuration `eff` will run (one per rule with a covering loss).

    `origins`: spec path -> how the server came to run that value ("defaulted", "applied by admission");
    a path not named is "as configured" (the user's value or an operator override)."""
    out = []
    for rule in ruleset.costed:
        entries = [c for c in rule.cost if c.representative and covers(c, eff)]
        if not entries:
            continue
        paths = list(rule.mitigation or {})
        origin = ", ".join(sorted({(origins or {}).get(p, "as configured") for p in paths}))
        f = _finding(rule, entries, eff, origin)
        if f is not None:
            out.append(f)
    return out
