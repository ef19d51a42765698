"""Reconciler: GDNModelServer → Deployment + Service (+ PodMonitor), gated by the known-crash rules.

`reconcile_sync` is plain code (runs in a worker thread; handlers/main.py registers the kopf handlers
that call it) so it can be driven directly by tests and by the drift corrector.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.rest import ApiException

from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.handlers import kube
from gdn_operator.handlers import status as st
from gdn_operator.render import autoscale, lws, router
from gdn_operator.render.engine import RenderError, render_all
from gdn_operator.render.scaleout import MANAGED_KINDS, ScaleOutOptions
from gdn_operator.rules import Evaluation, evaluate

if TYPE_CHECKING:
    from gdn_operator.handlers.runtime import Runtime

log = logging.getLogger(__name__)

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"
ANNOTATION_PREFIX = "kopf.serving.gdn-operator.io"
MITIGATIONS_ANNOTATION = "serving.gdn-operator.io/mitigations"


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


#: server-side apply answers some invalid objects with HTTP 500 ("failed to create typed patch object
#: ...: field not declared in schema"); those never succeed on retry, like a 400/422
_INVALID_500 = ("failed to create typed patch object", "field not declared in schema", "is invalid", "invalid value")


def refused_as_invalid(e: ApiException) -> bool:
    """True when the API server refused an object for what it is (permanent), not for a passing fault."""
    if e.status in (400, 422):
        return True
    if e.status != 500:
        return False
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        body = {}
    text = f"{body.get('reason', '')} {body.get('message', '')}".lower() if isinstance(body, dict) else ""
    return (isinstance(body, dict) and body.get("reason") == "Invalid") or any(m in text for m in _INVALID_500)


def mitigations_note(findings: list[Any]) -> str:
    """The value of the mitigations annotation: rule id → the spec change applied for it."""
    return json.dumps(
        {f.rule: f.mitigation for f in findings if f.action == "mitigated"}, sort_keys=True, separators=(",", ":")
    )


@dataclass
class Plan:
    """What the operator decides for an object: one computation shared by the reconciler, the drift
    corrector and the crash watch, so they can never disagree."""

    spec: GDNModelServerSpec | None = None
    ev: Evaluation | None = None
    objects: list[dict[str, Any]] | None = None  # None: nothing to apply (invalid or rejected)
    problem: str = ""  # why there is nothing to apply
    monitoring: bool = False  # PodMonitors are managed (configured, and the CRD exists)

    @property
    def run_spec(self) -> GDNModelServerSpec | None:
        return (self.ev.mitigated_spec if self.ev else None) or self.spec


def plan(body: dict[str, Any], rt: Runtime) -> Plan:
    cfg = rt.settings
    meta = body["metadata"]
    try:
        spec = parse_spec(body.get("spec") or {})
    except ManifestError as e:
        return Plan(problem="; ".join(e.problems))
    ev = evaluate(spec, default_policy=cfg.default_policy)
    if not ev.allowed:
        return Plan(spec, ev, problem=ev.denial_message())
    out = Plan(spec, ev, monitoring=cfg.pod_monitors and rt.crds.exists(PODMONITOR_CRD))
    run_spec = ev.mitigated_spec or spec  # = out.run_spec, never None here: the spec parsed and is allowed
    missing = missing_apis(run_spec, rt)
    if missing:
        out.problem = missing
        return out
    try:
        out.objects = render_all(meta["name"], meta["namespace"], run_spec, meta.get("uid"), with_monitoring=out.monitoring,
                                 scaleout=scaleout_options(body, run_spec, rt))
    except RenderError as e:
        out.problem = str(e)
    return out


def missing_apis(spec: GDNModelServerSpec, rt: Runtime) -> str:
    """Why the cluster cannot run this spec (an API it needs is not installed), or ""."""
    if spec.nodes > 1 and not rt.crds.exists(lws.CRD):
        return (f"spec.nodes {spec.nodes} needs the LeaderWorkerSet API ({lws.CRD}), which is not installed; "
                "install LeaderWorkerSet (sigs.k8s.io/lws) or set spec.nodes to 1")
    if spec.router is not None and spec.router.inference_pool is not None and not rt.crds.exists(router.CRD):
        return (f"spec.router.inferencePool needs the Gateway API Inference Extension ({router.CRD}), which is not "
                "installed; install its CRDs or remove spec.router.inferencePool")
    return ""


def scaleout_options(body: dict[str, Any], spec: GDNModelServerSpec, rt: Runtime) -> ScaleOutOptions:
    """Cluster facts for the scale-out renderers: KEDA or HPA, and whether scale-up is paused (CrashLooping)."""
    if spec.autoscaling is None:
        return ScaleOutOptions()
    cfg = rt.settings
    keda = bool(cfg.keda_prometheus_address) and rt.crds.exists(autoscale.KEDA_CRD)
    return ScaleOutOptions(
        keda=keda,
        prometheus_address=cfg.keda_prometheus_address,
        scale_up_paused=st.is_true(body.get("status") or {}, st.CRASH_LOOPING),
    )


def prune(body: dict[str, Any], objects: list[dict[str, Any]], rt: Runtime) -> list[str]:
    """Delete the optional objects this server owns but its spec no longer renders (a Deployment after a
    switch to a LeaderWorkerSet, an HPA replaced by a ScaledObject, a dropped InferencePool)."""
    meta = body["metadata"]
    cfg = rt.settings
    kept = {(o["apiVersion"], o["kind"]) for o in objects}
    # only kinds the operator may manage (the chart grants RBAC per enabled feature): never a forbidden call
    enabled = {"Deployment": True, lws.KIND: cfg.lws, "InferencePool": cfg.inference_pool,
               "HorizontalPodAutoscaler": cfg.hpa, "ScaledObject": bool(cfg.keda_prometheus_address)}
    disabled = {k for k, on in enabled.items() if not on}
    gone = []
    for api_version, kind in MANAGED_KINDS:
        if (api_version, kind) in kept or kind in disabled:
            continue
        if kube.delete_owned(kind, meta["namespace"], meta["name"], meta.get("uid"), rt.crds):
            gone.append(kind)
    if gone:
        log.info("%s/%s: deleted %s no longer in the spec", meta["namespace"], meta["name"], ", ".join(gone))
    return gone


def expected_objects(body: dict[str, Any], rt: Runtime) -> list[dict[str, Any]] | None:
    """What the operator would have applied for this object now (None: invalid or rejected)."""
    return plan(body, rt).objects


def _not_validated(body: dict[str, Any], reason: str, event: str, msg: str, ev: Evaluation | None = None) -> None:
    """Record why nothing (new) is applied: Validated=False with the reason, findings, and an Event when
    that is news (a retry, a resumed handler or an operator restart repeats no Event)."""
    meta = body["metadata"]
    gen = meta.get("generation")
    news = {"changed": False}

    def mutate(status: dict[str, Any], _obj: dict[str, Any]) -> None:
        news["changed"] = status.get("observedGeneration") != gen
        status["observedGeneration"] = gen
        if ev is not None:
            status["findings"] = [f.model_dump(by_alias=True, exclude_none=True, mode="json") for f in ev.findings]
            status["effective"] = ev.effective.model_dump(by_alias=True, exclude_none=True, mode="json")
        if st.set_condition(status, st.VALIDATED, False, reason, msg, gen):
            news["changed"] = True
        if st.is_true(status, st.PROGRESSING):
            st.set_condition(status, st.PROGRESSING, False, reason, "Nothing is applied for this generation: " + msg, gen)

    kube.update_status(meta["namespace"], meta["name"], mutate)
    if news["changed"]:
        log.info("not applied %s/%s generation %s: %s: %s", meta["namespace"], meta["name"], gen, reason, msg[:300])
        kube.emit_event(body, event, msg, "Warning")


def reconcile_sync(body: dict[str, Any], rt: Runtime) -> str:
    """Bring the cluster to the object's spec. Returns a short outcome word (for logs and tests)."""
    cfg = rt.settings
    meta = body["metadata"]
    ns, name, gen = meta["namespace"], meta["name"], meta.get("generation")

    p = plan(body, rt)
    ev = p.ev
    if ev is not None and not ev.allowed:
        existing = kube.get_deployment(ns, name) or (kube.get_object(lws.KIND, ns, name) if rt.crds.exists(lws.CRD) else None)
        tail = " The previously admitted configuration keeps running." if existing is not None else " Nothing was created."
        _not_validated(body, "KnownIssue", "Rejected", p.problem + tail, ev)
        return "rejected"
    if p.objects is None:
        _not_validated(body, "InvalidSpec", "InvalidSpec", p.problem, ev)
        return "invalid"
    if ev is None or p.spec is None or p.run_spec is None:  # plan() gives objects only for a parsed, allowed spec
        raise kopf.PermanentError(f"{ns}/{name}: internal error: objects planned without an evaluated spec")
    run_spec, objects = p.run_spec, p.objects
    policy = p.spec.admission_policy or cfg.default_policy
    findings = [f.model_dump(by_alias=True, exclude_none=True, mode="json") for f in ev.findings]
    effective = ev.effective.model_dump(by_alias=True, exclude_none=True, mode="json")

    mitigated = [f for f in ev.findings if f.action == "mitigated"]
    warned = [f for f in ev.findings if f.action == "warned"]
    if mitigated:
        value = mitigations_note(ev.findings)
        if (meta.get("annotations") or {}).get(MITIGATIONS_ANNOTATION) != value:
            kube.patch_server(ns, name, {"metadata": {"annotations": {MITIGATIONS_ANNOTATION: value}}})

    reason = "Mitigated" if mitigated else ("AdmittedWithWarnings" if warned else "Admitted")
    vmsg = {
        "Mitigated": "Admitted with mitigations (policy %s): " % policy + ", ".join(f.rule for f in mitigated),
        "AdmittedWithWarnings": "Admitted; known issues to watch: " + ", ".join(f.rule for f in warned),
        "Admitted": "No known crash or corruption rule matches this configuration.",
    }[reason]

    news = {"changed": False}

    def applied(status: dict[str, Any], _obj: dict[str, Any]) -> None:
        news["changed"] = status.get("observedGeneration") != gen
        status["observedGeneration"] = gen
        status["findings"] = findings
        status["effective"] = effective
        if st.set_condition(status, st.VALIDATED, True, reason, vmsg, gen):
            news["changed"] = True
        ready = int(status.get("readyReplicas") or 0)
        desired = run_spec.replicas if run_spec.autoscaling is None else int(status.get("replicas") or run_spec.autoscaling.min_replicas)
        st.set_replicas(status, desired, ready, gen)
        if ready < desired or not st.is_true(status, st.READY):
            st.set_condition(status, st.PROGRESSING, True, "Applying", "Applying the engine Deployment for this generation; waiting for pods.", gen)

    kube.update_status(ns, name, applied)
    if news["changed"]:  # Events on transitions only: a resumed handler or a retry repeats none
        log.info("%s %s/%s generation %s (policy %s)%s", reason.lower(), ns, name, gen, policy,
                 ": " + ", ".join(f"{f.rule} {f.action}" for f in mitigated + warned) if mitigated or warned else "")
        if mitigated:
            kube.emit_event(body, "Mitigated", "; ".join(f"{f.rule}: {f.message}" for f in mitigated), "Warning")
        if warned:
            kube.emit_event(
                body,
                "KnownIssueWarning",
                f"{len(warned)} known issue(s) to watch: " + "; ".join(f"{f.rule} ({f.kind})" for f in warned)
                + ". Details in status.findings.",
                "Warning",
            )
    workload = next((o for o in objects if o["kind"] in ("Deployment", lws.KIND)), None)
    before = kube.get_object(workload["kind"], ns, name) if workload is not None else None
    # The status above already says which generation this is and why it was admitted, so a client never
    # sees Ready (from the Deployment) without observedGeneration; now make the cluster match it.
    after: dict[str, Any] | None = None
    try:
        for obj in objects:
            out = kube.apply(obj)
            if obj is workload:
                after = out
    except ApiException as e:
        if e.status != 403 and not refused_as_invalid(e):
            raise  # transient (5xx, timeouts): kopf retries
        detail = _api_message(e)
        forbidden = e.status == 403
        _not_validated(body, "Forbidden" if forbidden else "InvalidSpec", "ApplyRefused",
                       f"the API server refused the engine {obj['kind']}: {detail}")
        if forbidden:
            # RBAC may be fixed: retry, slowly
            raise kopf.TemporaryError(f"RBAC refused the engine {obj['kind']}: {detail}", delay=300) from None
        return "refused"
    if p.monitoring and not run_spec.metrics.enabled:
        kube.delete_pod_monitor(ns, name)
    prune(body, objects, rt)

    if before is None or _rv(before) != _rv(after):  # the workload changed (a no-op apply writes nothing)
        kinds = [o["kind"] for o in objects]
        kube.emit_event(body, "Applied", f"{', '.join(kinds[:-1])} and {kinds[-1]} applied for generation {gen}.")
        log.info("applied %s/%s generation %s: %s", ns, name, gen, ", ".join(kinds))
        return "applied"
    return "unchanged"


def _rv(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


#: kopf's record of the last spec its handlers completed (the same storage main.configure installs)
DIFFBASE = kopf.AnnotationsDiffBaseStorage(prefix=ANNOTATION_PREFIX, key="last-handled-configuration")


async def reconcile(body: kopf.Body, logger: kopf.Logger, rt: Runtime) -> None:
    """kopf's create/update/resume handler (handlers/main.py): reconcile in a worker thread."""
    outcome = await asyncio.to_thread(reconcile_sync, kube.plain(body), rt)
    logger.info("reconciled: %s", outcome)


async def converge_generation(body: kopf.Body, logger: kopf.Logger, rt: Runtime) -> None:
    """status.observedGeneration reaches metadata.generation whatever kopf coalesces.

    kopf calls the update handler only when the spec differs from the last one it handled; patches
    A → B → A in quick succession are coalesced into "no change", leaving observedGeneration behind for
    good although the cluster runs A. When the generation moved but the spec is the one kopf last
    handled (so no handler will run), reconcile now: idempotent, writes the current generation."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    if gen is None or observed is None or observed >= gen or meta.get("deletionTimestamp"):
        return
    handled = DIFFBASE.fetch(body=body)
    if handled is None or kube.plain(handled.get("spec")) != kube.plain(body.get("spec")):
        return  # the spec changed: kopf's update handler runs for it (and writes the generation)
    outcome = await asyncio.to_thread(reconcile_sync, kube.plain(body), rt)
    logger.info("generation %s carries the spec already handled; status converged (%s)", gen, outcome)


def apply_autoscaler(namespace: str, name: str, rt: Runtime) -> str | None:
    """Re-apply only the server's autoscaler (after CrashLooping changed). Returns "paused"/"resumed"
    when the scale-up policy changed, None otherwise."""
    body = kube.get_server(namespace, name)
    if body is None:
        return None
    p = plan(body, rt)
    scaler = next((o for o in p.objects or [] if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")), None)
    if scaler is None:
        return None
    current = kube.get_object(scaler["kind"], namespace, name)
    paused = autoscale.scale_up_paused(scaler)
    was_paused = current is not None and autoscale.scale_up_paused(current)
    if current is not None and paused == was_paused:
        return None
    try:
        kube.apply(scaler)
    except ApiException as e:
        if e.status != 403:
            raise
        log.warning("%s/%s: cannot update the %s (RBAC: enable it in the chart's scaleOut values)", namespace, name, scaler["kind"])
        return None
    word = "paused" if paused else "resumed"
    log.info("%s/%s: scale-up %s (%s)", namespace, name, word, "CrashLooping" if paused else "crash loop over")
    kube.emit_event(body, "ScaleUpPaused" if paused else "ScaleUpResumed",
                    f"{scaler['kind']} scale-up {word}: " + ("the engines are crash-looping; more replicas would only multiply the crash"
                                                             if paused else "the engines run again"), "Warning" if paused else "Normal")
    return word
