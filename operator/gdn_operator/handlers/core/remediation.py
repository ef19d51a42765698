"""Remediation: the change that stops a repeated known crash (or a silent-corruption alarm of the output
probes), made once per signature per configuration revision — as an operator-owned OVERRIDE.

The operator never writes the server's spec (a GitOps controller would revert it and the crash loop would
come back): the workaround is recorded in status.overrides (api/overrides.py: path, value, reason = the
crash signature, generation, since) and applied when the workload is rendered; the caller re-applies the
workload (handlers/core/overrides.py). When one known signature repeats `spec.remediation.threshold` times on the
same revision (the generation plus the remediation overrides in force, api/overrides.revision), the
catalogue's documented workaround is applied once (a change already in effect is never re-applied, so it
cannot loop). A signature with a `remediation.ladder` (the illegal-address
signatures under TP >= 2, issue 18) first gets the ladder's settings that keep speculative decoding on, in
order, each tried once, with the step and its reason in status.remediations[].reason; its own action
(disable speculative decoding) is the last resort. A crash reported as a generic class because the evidence
for its upstream issue is missing (issue 16) carries action `investigate`: never remediated automatically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gdn_operator import telemetry
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.overrides import add_override, apply_overrides, live_overrides, revision, set_overrides
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.rules import evaluate
from gdn_operator.watch.catalogue import default_catalogue
from gdn_operator.watch.result import ClassificationResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    action: str  # human form, e.g. "asyncScheduling=false"
    patch: dict[str, Any]  # the same as a merge patch (status.remediations[].changes)
    spec_patch: SpecPatch = SpecPatch()

    @classmethod
    def of(cls, change: SpecPatch | None) -> Change | None:
        return cls(change.describe(), change.merge_patch(), change) if change else None


def _live(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return live_overrides(obj.get("status") or {}, obj.get("spec") or {}, (obj.get("metadata") or {}).get("annotations"))[0]


def running_spec(obj: dict[str, Any], policy: str) -> GDNModelServerSpec:
    """What the engine runs for `obj`: its spec with the remediation overrides in force, unset fields at their
    safe defaults and the policy's mitigations applied (what handlers/core/plan.py renders)."""
    spec = parse_spec(obj.get("spec") or {})
    try:
        with_overrides = apply_overrides(spec, _live(obj))
    except ValidationError:
        with_overrides = spec
    return evaluate(with_overrides, default_policy=policy).run_spec or with_overrides


def running_dict(obj: dict[str, Any], policy: str) -> dict[str, Any]:
    return running_spec(obj, policy).model_dump(by_alias=True, mode="json")


def remediation_for(action: str, spec: GDNModelServerSpec) -> Change | None:
    """The spec change a catalogue remediation action makes (data/signatures.yaml `actions:`), or None when
    it needs a human (or is already in effect)."""
    return Change.of(default_catalogue().remedy_patch(action, spec))


def _admission_refusal(obj: dict[str, Any], change: Change, policy: str) -> str | None:
    """Why the workaround, on top of the overrides in force, would not pass admission under the operator's
    default `policy` (None: it would)."""
    try:
        spec = apply_overrides(parse_spec(obj.get("spec") or {}), _live(obj))
        new_spec = GDNModelServerSpec.model_validate(
            change.spec_patch.apply(spec.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        )
        if not evaluate(new_spec, default_policy=policy).allowed:
            return f"{change.action} would itself be refused by admission"
    except ManifestError as e:
        return f"{change.action} would make the spec invalid: {'; '.join(e.problems)}"
    except ValidationError as e:
        return f"{change.action} would make the spec invalid ({e.error_count()} error(s))"
    return None


def choose_remediation(
    sig: str, result: ClassificationResult, spec: GDNModelServerSpec, obj: dict[str, Any], policy: str
) -> tuple[Change | None, str | None, str | None]:
    """(change, refusal, reason) for a repeated crash.

    A signature's `remediation.ladder` (data/signatures.yaml) lists settings that keep speculative decoding on;
    those that apply at the spec's tensorParallelSize are tried in order, each at most once for this signature
    (status.remediations remembers what was tried), before the signature's own action (the last resort).
    A step already in effect, or one admission would refuse, is passed over."""
    rem = result.remediation
    action = rem.action if rem else "investigate"
    steps = [s for s in (rem.ladder if rem else ()) if spec.tensor_parallel_size >= s.min_tp]
    tried = {r.get("action") for r in (obj.get("status") or {}).get("remediations") or [] if r.get("signature") == sig}
    refusal = None
    passed: list[str] = []
    for i, step in enumerate(steps):
        change = remediation_for(step.action, spec)
        if change is None:
            continue
        if change.action in tried:
            passed.append(f"{change.action} (tried before)")
            continue
        refusal = _admission_refusal(obj, change, policy)
        if refusal:
            passed.append(refusal)
            continue
        last = "; ".join(passed)
        return (
            change,
            None,
            (
                f"step {i + 1} of {len(steps)} that keep speculative decoding on: {change.action} ({step.reason})"
                + (f"; passed over: {last}" if last else "")
                + f"; last resort: {action}"
            ),
        )
    change = remediation_for(action, spec)
    if change is not None:
        refusal = _admission_refusal(obj, change, policy)
        if refusal:
            return None, refusal, None
        why = None
        if steps:
            why = f"last resort after the settings that keep speculative decoding on ({'; '.join(passed) or 'none applicable'})"
        return change, None, why
    return None, refusal, None


def maybe_remediate(
    servers: Servers,
    namespace: str,
    name: str,
    obj: dict[str, Any],
    result: ClassificationResult,
    count: int,
    generation: int | None,
    *,
    policy: str,
) -> Change | None:
    """After a repeated crash: record the signature's workaround as an override, once per revision
    (spec.remediation.mode auto). The caller re-applies the workload when a change is returned."""
    try:
        spec = running_spec(obj, policy)  # the ladder's steps are judged against what runs
    except ManifestError:
        return None
    if spec.remediation.mode != "auto" or count < spec.remediation.threshold or result.generic:
        return None
    sig = result.signature or ""
    action = result.remediation.action if result.remediation else "investigate"
    change, refusal, why = choose_remediation(sig, result, spec, obj, policy)
    hint = result.remediation.hint if result.remediation else "Investigate the engine log."
    trigger = f"{sig} crashed the engine {count} times on generation {generation}"

    def claimed_crash(status: dict[str, Any]) -> None:
        if change:
            st.set_condition(status, st.CRASH_LOOPING, True, "Remediated", f"applied {change.action} after {sig}", generation)

    return remediate_once(
        servers,
        namespace,
        name,
        obj,
        signature=sig,
        upstream=result.upstream,
        generation=generation,
        change=change,
        reason=trigger
        + (f"; {why}" if change and why else "")
        + ("" if change else f"; no automatic workaround left ({refusal or action}): {hint}"),
        not_possible=f"{sig} repeated {count} times; no automatic workaround left ({refusal or action}): {hint}",
        applied=f"Applied {{action}} to stop repeated {sig}"
        + (f" ({result.upstream})" if result.upstream else "")
        + f" after {count} crashes, as an operator override (status.overrides; the spec is unchanged; annotate "
        "serving.gdn-operator.io/clear-overrides to drop it)." + (f" {why[0].upper()}{why[1:]}." if why else ""),
        on_claim=claimed_crash,
    )


def change_from_mitigation(rule: str, mitigation: dict[str, Any] | None, spec: dict[str, Any]) -> Change | None:
    """A catalogue rule's `mitigation` (camelCase spec paths → value, None = unset) as a merge patch, or
    None when there is none or it is already in effect."""
    return Change.of(SpecPatch.of(mitigation).pending(spec))


def vet_change(obj: dict[str, Any], change: Change | None, policy: str) -> tuple[Change | None, str | None]:
    """The change if the patched spec is valid and itself passes admission; else (None, why not)."""
    if change is None:
        return None, None
    refusal = _admission_refusal(obj, change, policy)
    return (None, refusal) if refusal else (change, None)


def remediate_once(
    servers: Servers,
    namespace: str,
    name: str,
    obj: dict[str, Any],
    *,
    signature: str,
    upstream: str | None,
    generation: int | None,
    change: Change | None,
    reason: str,
    not_possible: str,
    applied: str,
    on_claim: Callable[[dict[str, Any]], None] | None = None,
    act: tuple[str, Callable[[], bool]] | None = None,
) -> Change | None:
    """Record one remediation per `signature` per revision as an override (shared by the crash watch and the
    output probes; the caller re-applies the workload when a change is returned). The decision is claimed atomically in status.remediations (resourceVersion), so two
    triggers at the same moment cannot both act; `change` None records that nothing automatic is left
    (Event RemediationNotPossible, message `not_possible`). `applied` is the Remediated Event's message,
    with {action} filled in. `act` (action label, callable) is a remediation that is no spec change (the stall
    watch's pod restart): claimed and recorded the same way, then called instead of patching the spec."""
    record = {
        "time": kube.now(),
        "signature": signature,
        "upstream": upstream,
        "generation": generation,
        "action": act[0] if act else (change.action if change else "none"),
        "changes": change.patch if change else {},
        "reason": reason,
    }
    claimed: list[bool] = []

    def claim(status: dict[str, Any], fresh: dict[str, Any]) -> None:
        claimed.clear()
        rem = list(status.get("remediations") or [])
        user = fresh.get("spec") or {}
        live = live_overrides(status, user, (fresh.get("metadata") or {}).get("annotations"))[0]
        rev = revision(generation, live)
        # once per signature per revision (a record from before overrides has no revision: its generation's)
        if any(
            r.get("signature") == signature and r.get("generation") == generation and r.get("revision", str(generation)) == rev
            for r in rem
        ):
            return
        rem.append({k: v for k, v in {**record, "revision": rev}.items() if v is not None})
        status["remediations"] = rem[-32:]
        if change is not None:
            # the spec is never written: the change is an operator-owned override, applied at render
            set_overrides(status, live + [o for o in status.get("overrides") or [] if o.get("source") == "mitigation"])
            add_override(status, change.spec_patch, reason=signature, generation=generation, since=str(record["time"]), spec=user)
            st.set_overridden(status, generation)
        if on_claim is not None:
            on_claim(status)
        claimed.append(True)

    obj = servers.update_status(namespace, name, claim, obj=obj) or obj  # from the newest body: no read
    if not claimed:
        return None
    if act is not None:
        done = act[1]()
        log.info(
            "remediated %s/%s: %s for %s on generation %s (%s)",
            namespace,
            name,
            act[0],
            signature,
            generation,
            "done" if done else "nothing left to do",
        )
        if done:
            kube.emit_event(obj, "Remediated", applied.replace("{action}", act[0]), "Warning")
        return None
    if change is None:
        log.warning("no remediation for %s/%s generation %s: %s", namespace, name, generation, not_possible)
        kube.emit_event(obj, "RemediationNotPossible", not_possible, "Warning")
        return None
    telemetry.REMEDIATIONS.labels(namespace, name, signature, change.action).inc()
    log.info("remediated %s/%s: %s for %s on generation %s", namespace, name, change.action, signature, generation)
    kube.emit_event(obj, "Remediated", applied.replace("{action}", change.action), "Warning")
    return change
