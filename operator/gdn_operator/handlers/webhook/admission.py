"""Admission webhooks: one mutating handler (policy `mitigate`, only with the opt-in setting
GDN_MUTATE_SPEC / chart operator.mutateSpec: by default the operator never writes a server's spec and
mitigations are status.overrides applied at render) and one validating handler.

kopf runs every validate handler as its own webhook, so all rules are evaluated by a single handler
that calls the same evaluator as `gdnctl validate` and the reconciler. Updates that do not change the
spec (finalizers, annotations, kopf's own bookkeeping) are always admitted, so a rule added after an
object was created can never wedge that object.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from gdn_operator import telemetry
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.handlers.core.kube import plain
from gdn_operator.handlers.core.plan import ClusterFacts, may_read_api, missing_apis
from gdn_operator.rules import evaluate
from gdn_operator.rules.admit import verdict

log = logging.getLogger(__name__)

#: the validating webhook's kopf handler id, which is also its path on the webhook server (the front answers it:
#: front.py)
VALIDATE_ID = "gdn-admission"
#: the mutating webhook's (opt-in: GDN_MUTATE_SPEC)
MITIGATE_ID = "gdn-mitigate"

#: opt-in spec mutation only: rule id -> the spec change the mutating webhook wrote for it
MITIGATIONS_ANNOTATION = "serving.gdn-operator.io/mitigations"


def mitigations_note(findings: list[Any]) -> str:
    """The value of the mitigations annotation: rule id → the spec change applied for it."""
    return json.dumps({f.rule: f.mitigation for f in findings if f.action == "mitigated"}, sort_keys=True, separators=(",", ":"))


def _spec_unchanged(old: Mapping[str, Any] | None, new_spec: Any) -> bool:
    return old is not None and plain(old.get("spec")) == plain(new_spec)


def mitigation_patch(spec: dict[str, Any], default_policy: str) -> tuple[dict[str, Any], list[Any]] | None:
    """The merge patch (spec fields + annotation) the mutating webhook applies, or None."""
    try:
        s = parse_spec(spec)
    except ManifestError:
        return None  # the validating webhook explains what is wrong
    ev = evaluate(s, default_policy=default_policy)
    if not ev.allowed or ev.mitigated_spec is None or not ev.patch:
        return None
    mitigated = [f for f in ev.findings if f.action == "mitigated"]
    merge = {"spec": ev.merge_patch(), "metadata": {"annotations": {MITIGATIONS_ANNOTATION: mitigations_note(ev.findings)}}}
    return merge, mitigated


def mitigate(
    spec: kopf.Spec,
    patch: kopf.Patch,
    warnings: list[str],
    namespace: str | None,
    name: str | None,
    old: kopf.Body | None,
    default_policy: str,
) -> None:
    """The mutating webhook (policy `mitigate`): the rules' spec changes, as a patch with a warning each."""
    if _spec_unchanged(old, spec):
        return
    result = mitigation_patch(plain(spec), default_policy)
    if result is None:
        return
    merge, mitigated = result
    for key, value in merge.items():
        patch[key] = value
    for f in mitigated:
        warnings.append(f"mitigated {f.line()}")
        telemetry.admission_decision(namespace or "", "mitigated", f.rule).inc()
    log.info("admission mutated %s/%s: mitigated %s", namespace, name, ", ".join(f.rule for f in mitigated))


def admission(
    spec: Mapping[str, Any],
    warnings: list[str],
    namespace: str | None,
    name: str | None,
    old: Mapping[str, Any] | None,
    rt: ClusterFacts,
) -> None:
    """The validating webhook: the verdict `gdnctl validate` gives offline (rules/admit.py: the name, the spec,
    the pod-isolation opt-ins, the rules), then the cluster's optional APIs (AdmissionError when refused)."""
    cfg = rt.settings
    if old is not None and _spec_unchanged(old, spec):
        return
    v = verdict(plain(spec), name=name, creating=old is None, allow_unsafe=cfg.allow_unsafe, default_policy=cfg.default_policy)
    ev = v.evaluation
    if v.reason in ("invalid-name", "invalid-spec", "unsafe-pod-settings"):
        _deny(namespace, name, v.reason, v.message[:300])
        raise kopf.AdmissionError(v.message, code=v.code)
    assert ev is not None  # verdict: the spec parsed (only invalid-spec has no evaluation)
    for f in ev.findings:
        if f.action == "warned":
            warnings.append(f.line())
            telemetry.admission_decision(namespace or "", "warned", f.rule).inc()
    if not v.allowed:
        rules = [f.rule for f in ev.findings if f.action == "rejected"]
        for rule in rules:
            telemetry.admission_decision(namespace or "", "denied", rule).inc()
        log.info("admission denied %s/%s: %s", namespace, name, ", ".join(rules))
        raise kopf.AdmissionError(v.message, code=v.code)
    run = ev.run_spec
    assert run is not None  # admitted
    missing = missing_apis(run, rt)
    if missing and cfg.missing_api_policy == "reject":
        _deny(namespace, name, "missing-api", missing)
        raise kopf.AdmissionError(missing + " (refused by the operator's chart value operator.missingApiPolicy)", code=403)
    if missing:
        warnings.append(f"not runnable on this cluster yet: {missing}")
        telemetry.admission_decision(namespace or "", "warned", "missing-api").inc()
    unprobed = probes_without_key(run, cfg.read_api_key_secrets)
    if unprobed:
        warnings.append(unprobed)
        telemetry.admission_decision(namespace or "", "warned", "probes-without-api-key").inc()
    telemetry.admission_decision(namespace or "", "admitted", "").inc()
    warned = [f.rule for f in ev.findings if f.action == "warned"] + (["missing-api"] if missing else [])
    warned += ["probes-without-api-key"] if unprobed else []
    log.info("admission admitted %s/%s%s", namespace, name, f" with warnings: {', '.join(warned)}" if warned else "")


async def admit(
    spec: Mapping[str, Any],
    warnings: list[str],
    namespace: str | None,
    name: str | None,
    old: Mapping[str, Any] | None,
    rt: ClusterFacts,
) -> None:
    """`admission` from an event loop (kopf's in the operator's process, or the webhook front's): on the loop, as it
    does no I/O, except for a spec whose optional-API check may read a CRD from the API server (handlers/core/kube.py
    CrdCache, once a minute), validated in a thread."""
    if may_read_api(spec):
        await asyncio.to_thread(admission, spec, warnings, namespace, name, old, rt)
    else:
        admission(spec, warnings, namespace, name, old, rt)


def probes_without_key(spec: Any, can_read_secrets: bool) -> str:
    """The warning for output probes against engines that want an API key the operator may not read ("" when
    none): every probe would get HTTP 401 (OutputConsistent Unknown/ProbeUnauthorized, alert GDNProbesFailing)."""
    probes = spec.probes
    if can_read_secrets or spec.api_key_secret is None or probes is None or not probes.enabled:
        return ""
    ref = spec.api_key_secret
    return (
        f"spec.probes with spec.apiKeySecret ({ref.name}/{ref.key}): the operator may not read Secrets (chart value "
        "operator.readApiKeySecrets is false), so the engines will answer every output probe with HTTP 401 and "
        "OutputConsistent stays Unknown (ProbeUnauthorized); set operator.readApiKeySecrets=true, or turn spec.probes off"
    )


def _deny(namespace: str | None, name: str | None, why: str, detail: str) -> None:
    telemetry.admission_decision(namespace or "", "denied", why).inc()
    log.info("admission denied %s/%s: %s", namespace, name, detail)
