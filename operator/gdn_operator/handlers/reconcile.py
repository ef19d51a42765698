"""Reconciler: GDNModelServer → Deployment + Service (+ PodMonitor), gated by the known-crash rules.

kopf wiring is at the bottom; `reconcile_sync` is plain code (runs in a worker thread) so it can be
driven directly by tests and by the drift corrector.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.handlers import kube
from gdn_operator.handlers import status as st
from gdn_operator.handlers.config import get_config
from gdn_operator.render.engine import RenderError, render_all
from gdn_operator.rules import evaluate

log = logging.getLogger(__name__)

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"
MITIGATIONS_ANNOTATION = "serving.gdn-operator.io/mitigations"


def _findings_dump(ev: Any) -> list[dict[str, Any]]:
    return [f.model_dump(by_alias=True, exclude_none=True, mode="json") for f in ev.findings]


def _effective_dump(ev: Any) -> dict[str, Any] | None:
    eff = getattr(ev, "effective", None)
    if eff is None:
        return None
    if hasattr(eff, "model_dump"):
        return eff.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dict(eff)


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def expected_objects(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """What the operator would have applied for this object now (None: invalid or rejected)."""
    cfg = get_config()
    meta = body["metadata"]
    try:
        spec = parse_spec(body.get("spec") or {})
    except ManifestError:
        return None
    ev = evaluate(spec, default_policy=cfg.default_policy)
    if not ev.allowed:
        return None
    with_monitoring = cfg.pod_monitors and kube.crd_exists(PODMONITOR_CRD)
    try:
        return render_all(meta["name"], meta["namespace"], ev.mitigated_spec or spec, meta.get("uid"), with_monitoring=with_monitoring)
    except RenderError:
        return None


def reconcile_sync(body: dict[str, Any]) -> str:
    """Bring the cluster to the object's spec. Returns a short outcome word (for logs and tests)."""
    cfg = get_config()
    meta = body["metadata"]
    ns, name, gen, uid = meta["namespace"], meta["name"], meta.get("generation"), meta.get("uid")

    try:
        spec = parse_spec(body.get("spec") or {})
    except ManifestError as e:
        msg = "; ".join(e.problems)

        def invalid(status: dict[str, Any], _obj: dict[str, Any]) -> None:
            status["observedGeneration"] = gen
            st.set_condition(status, st.VALIDATED, False, "InvalidSpec", msg, gen)

        kube.update_status(ns, name, invalid)
        kube.emit_event(body, "InvalidSpec", msg, "Warning")
        return "invalid"

    policy = spec.admission_policy or cfg.default_policy
    ev = evaluate(spec, default_policy=cfg.default_policy)
    findings = _findings_dump(ev)
    effective = _effective_dump(ev)

    if not ev.allowed:
        existing = kube.get_deployment(ns, name)
        tail = (
            " The previously admitted configuration keeps running."
            if existing is not None
            else " Nothing was created."
        )
        msg = ev.denial_message() + tail

        def rejected(status: dict[str, Any], _obj: dict[str, Any]) -> None:
            status["observedGeneration"] = gen
            status["findings"] = findings
            if effective is not None:
                status["effective"] = effective
            st.set_condition(status, st.VALIDATED, False, "KnownIssue", msg, gen)

        kube.update_status(ns, name, rejected)
        kube.emit_event(body, "Rejected", msg, "Warning")
        return "rejected"

    run_spec = ev.mitigated_spec or spec
    with_monitoring = cfg.pod_monitors and kube.crd_exists(PODMONITOR_CRD)
    try:
        objects = render_all(name, ns, run_spec, uid, with_monitoring=with_monitoring)
    except RenderError as e:
        problem = str(e)

        def unrenderable(status: dict[str, Any], _obj: dict[str, Any]) -> None:
            status["observedGeneration"] = gen
            st.set_condition(status, st.VALIDATED, False, "InvalidSpec", problem, gen)

        kube.update_status(ns, name, unrenderable)
        kube.emit_event(body, "InvalidSpec", problem, "Warning")
        return "invalid"

    mitigated = [f for f in ev.findings if f.action == "mitigated"]
    warned = [f for f in ev.findings if f.action == "warned"]
    if mitigated:
        changes = {f.rule: f.mitigation for f in mitigated}
        annotations = (meta.get("annotations") or {})
        value = json.dumps(changes, sort_keys=True, separators=(",", ":"))
        if annotations.get(MITIGATIONS_ANNOTATION) != value:
            kube.patch_server(ns, name, {"metadata": {"annotations": {MITIGATIONS_ANNOTATION: value}}})
        kube.emit_event(
            body,
            "Mitigated",
            "; ".join(f"{f.rule}: {f.message}" for f in mitigated),
            "Warning",
        )
    if warned:
        kube.emit_event(
            body,
            "KnownIssueWarning",
            f"{len(warned)} known issue(s) to watch: " + "; ".join(f"{f.rule} ({f.kind})" for f in warned)
            + ". Details in status.findings.",
            "Warning",
        )

    reason = "Mitigated" if mitigated else ("AdmittedWithWarnings" if warned else "Admitted")
    vmsg = {
        "Mitigated": "Admitted with mitigations (policy %s): " % policy + ", ".join(f.rule for f in mitigated),
        "AdmittedWithWarnings": "Admitted; known issues to watch: " + ", ".join(f.rule for f in warned),
        "Admitted": "No known crash or corruption rule matches this configuration.",
    }[reason]

    def applied(status: dict[str, Any], _obj: dict[str, Any]) -> None:
        status["observedGeneration"] = gen
        status["findings"] = findings
        if effective is not None:
            status["effective"] = effective
        st.set_condition(status, st.VALIDATED, True, reason, vmsg, gen)
        ready = int(status.get("readyReplicas") or 0)
        st.set_replicas(status, run_spec.replicas, ready)
        if ready < run_spec.replicas or not st.is_true(status, st.READY):
            st.set_condition(status, st.PROGRESSING, True, "Applying", "Applying the engine Deployment for this generation; waiting for pods.", gen)

    kube.update_status(ns, name, applied)
    # The status above already says which generation this is and why it was admitted, so a client never
    # sees Ready (from the Deployment) without observedGeneration; now make the cluster match it.
    try:
        for obj in objects:
            kube.apply(obj)
    except ApiException as e:
        if e.status not in (400, 403, 422):
            raise  # transient (5xx, timeouts): kopf retries
        detail = _api_message(e)
        msg = f"the API server refused the engine {obj['kind']}: {detail}"
        forbidden = e.status == 403

        def refused(status: dict[str, Any], _obj: dict[str, Any]) -> None:
            status["observedGeneration"] = gen
            st.set_condition(status, st.VALIDATED, False, "Forbidden" if forbidden else "InvalidSpec", msg, gen)

        kube.update_status(ns, name, refused)
        kube.emit_event(body, "ApplyRefused", msg, "Warning")
        if forbidden:
            raise kopf.TemporaryError(msg, delay=300) from None  # RBAC may be fixed: retry, slowly
        return "refused"
    if with_monitoring and not run_spec.metrics.enabled:
        kube.delete_pod_monitor(ns, name)

    kube.emit_event(body, "Applied", f"Deployment and Service applied for generation {gen}.")
    return "applied"


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    outcome = await asyncio.to_thread(reconcile_sync, kube.plain(body))
    logger.info("reconciled: %s", outcome)
