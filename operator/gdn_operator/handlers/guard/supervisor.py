"""GDNGuard at run time: the crash watch, stall detection and acceptance on the engine pods of workloads other
tools create (a Deployment, StatefulSet, LeaderWorkerSet, a KServe LLMInferenceService, a KAITO Workspace, bare
pods), selected by a guard's label selector.

One code path with GDNModelServer: a target is a GDNModelServer or a guarded workload, and the run-time features
act on "the engine pods of a target":

* crash watch: each pod's container deaths (crashwatch.deaths_in, for the container the guard names or finds),
  classified by crashwatch.classify_death (the termination message, the same signature catalogue, the launch
  line's configuration as evidence), counted per signature and pod;
* acceptance and stall: AcceptanceSupervisor.measure scrapes the ready pods' /metrics (the launch line's --port)
  with the same scraper, tracker, anomaly detectors and stall detectors, and sets the same gdn_* series: a
  workload is `server` in their labels (its name), so the same alerts and dashboard rows work; its engine state
  is keyed by its kind, namespace and name (watch/target.py), never shared with a same-named GDNModelServer or
  a same-named workload of another kind;
* known crashes: the launch line read by rules/launchline.py and evaluated by the same rules (KnownCrash);
* output probes (`features.probes` with `spec.probes`): a second ProbeSupervisor (handlers/engines/probes.py) over the
  guarded pods, its writer this module's: OutputConsistent False is an OutputInconsistent finding (the probes'
  learned references, counts and gdn_probe_* / gdn_output_inconsistent series are the same code's).

Findings go to the guard's status (guard/status.compose: one write per round, only when changed), Events on the
owning workload (new objects of ours; the workload itself is never written), gdn_guard_findings, and a
PolicyReport per namespace where its CRD is installed. The one write to an object that is not the operator's is
opt-in: `remediation: deletePod` with the chart's GDN_GUARD_DELETE_PODS, which deletes a stalled pod or a pod
crashing twice with the same classified signature (deterministic), once per pod instance; without the setting a
guard reports what it would have done.

Pods the operator itself manages (label serving.gdn-operator.io/server) are left to the GDNModelServer path.

Size (~540 lines): one state machine over the guards (events, rounds, findings, remediation) whose parts share
its state; the probe wiring (probe_pods, probe_result, _configure_probes) is the part that would move out first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gdn_operator import telemetry
from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.handlers.core import kube, tasks
from gdn_operator.handlers.core.pods import api_pods, pod_summary
from gdn_operator.handlers.engines.acceptance import AcceptanceSupervisor
from gdn_operator.handlers.engines.crashwatch import CrashWatchState, Death, classify_death, deaths_in
from gdn_operator.handlers.engines.probes import ProbeSupervisor, ServerProbes
from gdn_operator.handlers.guard import client
from gdn_operator.handlers.guard.admission import GuardAdmission
from gdn_operator.handlers.guard.owners import Owners, WorkloadRef
from gdn_operator.handlers.guard.status import (
    FINDING_TYPES,
    Finding,
    WorkloadView,
    compose,
    fingerprint,
    policy_report,
)
from gdn_operator.labels import LABEL_SERVER
from gdn_operator.rules import evaluate_launch, read_endpoint
from gdn_operator.rules.workload import engine_container, resolve_version
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.guarded import selector_query, selects, version_problem
from gdn_operator.watch.probes import Condition, ProbeBook
from gdn_operator.watch.target import EngineTarget

log = logging.getLogger(__name__)

_POLICY_RETRY = 300.0  # seconds before asking again for a PolicyReport CRD that was not served


class GuardRuntime(CrashWatchState, Protocol):
    """What the guard controller reads of the runtime (handlers/runtime.py provides it)."""

    @property
    def acceptance(self) -> AcceptanceSupervisor: ...

    @property
    def guard_admission(self) -> GuardAdmission: ...


@dataclass
class GuardedPod:
    name: str
    uid: str
    container: str
    port: int
    argv: tuple[str, ...]
    version: str | None
    version_source: str
    version_problem: str | None
    summary: dict[str, Any]


@dataclass
class WorkloadState:
    ref: WorkloadRef
    pods: dict[str, GuardedPod] = field(default_factory=dict)
    crashes: dict[tuple[str, str], Finding] = field(default_factory=dict)  # (rule, pod) → the last crash finding
    crash_at: dict[tuple[str, str], float] = field(default_factory=dict)  # monotonic time of the last one
    known: list[Finding] = field(default_factory=list)
    known_for: tuple[tuple[str, ...], str | None] | None = None
    known_problem: str | None = None
    evidence: Evidence | None = None
    served: str = ""  # the model name the engine serves (--served-model-name, else the model): what probes ask for
    probe: Finding | None = None  # OutputConsistent False from the output probes
    measured: list[Finding] = field(default_factory=list)
    first_seen: dict[tuple[str, str, str], str] = field(default_factory=dict)
    acceptance: dict[str, Any] | None = None
    reported: set[tuple[str, str, str]] = field(default_factory=set)
    remediated: set[str] = field(default_factory=set)  # pod uids deleted (or that would have been)


@dataclass
class GuardState:
    namespace: str
    name: str
    uid: str | None = None
    generation: int | None = None
    spec: GDNGuardSpec | None = None  # None: the spec is not valid (problems says why)
    selector: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    workloads: dict[tuple[str, str], WorkloadState] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    written: str = ""
    next: float = 0.0

    def feature(self, name: str) -> bool:
        """Whether a feature of spec.features is on (admission, crash_watch, stall, acceptance, probes)."""
        return self.spec is not None and bool(getattr(self.spec.features, name))

    @property
    def delete_pods(self) -> bool:
        return self.spec is not None and self.spec.remediation == "deletePod"


class GuardSupervisor:
    """Guards and the pods they select (fed by GDNGuard and pod events), driven by one round task."""

    def __init__(self, rt: GuardRuntime) -> None:
        self.rt = rt
        self.guards: dict[tuple[str, str], GuardState] = {}
        self.pod_home: dict[tuple[str, str], tuple[tuple[str, str], tuple[str, str]]] = {}  # pod → (guard, workload)
        self.owners = Owners()
        self.policy_absent_at: float | None = None  # monotonic time the PolicyReport CRD was found not served
        self.policy_last: dict[str, str] = {}  # namespace → the report's fingerprint last applied
        self.task: asyncio.Task[None] | None = None
        #: output probes of guarded workloads: the GDNModelServer probes' code, reporting here (probe_result)
        self.probes = ProbeSupervisor(
            self.probe_pods, writer=self.probe_result, concurrency=rt.settings.probe_concurrency, rt=None
        )

    # ------------------------------------------------------------------------------------------- events ---

    async def on_guard_event(self, type_: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if type_ == "DELETED" or meta.get("deletionTimestamp"):
            guard = self.guards.get(key)
            if guard is not None:
                for pod, home in list(self.pod_home.items()):
                    if home[0] == key:
                        self._drop_pod(pod)
                for ws in guard.workloads.values():
                    self._forget_workload(guard, ws)
                del self.guards[key]
                log.info("guard %s/%s removed: its %d workload(s) are no longer guarded", *key, len(guard.workloads))
                await asyncio.to_thread(self._publish_policy, key[0])
            return
        guard = self.guards.setdefault(key, GuardState(*key))
        changed = guard.generation != meta.get("generation") or guard.uid != meta.get("uid")
        guard.uid, guard.generation = meta.get("uid"), meta.get("generation")
        try:
            guard.spec, guard.problems = GDNGuardSpec.model_validate(body.get("spec") or {}), []
            guard.selector = guard.spec.selector.dump()
        except ValueError as e:  # pydantic's ValidationError: what admission would have refused (no webhook)
            guard.spec, guard.selector, guard.problems = None, {}, [f"spec is not valid: {e}"]
        if not guard.status:
            guard.status = dict(body.get("status") or {})
        if changed:
            log.info("guard %s/%s generation %s: selecting pods by %s", *key, guard.generation, guard.selector)
            await self._rescan(guard)

    async def _rescan(self, guard: GuardState) -> None:
        """A new or changed guard: the pods of its namespace it selects now (pods it no longer selects leave)."""
        selector = guard.selector
        for pod, home in list(self.pod_home.items()):
            if home[0] == (guard.namespace, guard.name):
                self._drop_pod(pod)
        if not selector:
            return
        for body in await asyncio.to_thread(client.list_pods, guard.namespace, selector_query(selector)):
            await self.on_pod_event("RESCAN", body)

    def _guard_for(self, namespace: str, labels: dict[str, str]) -> GuardState | None:
        """The guard of a pod: the first by name among its namespace's guards that select it."""
        cands = [g for (ns, _), g in self.guards.items() if ns == namespace and selects(g.selector, labels)]
        return min(cands, key=lambda g: g.name) if cands else None

    async def on_pod_event(self, type_: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        labels = meta.get("labels") or {}
        key = (meta["namespace"], meta["name"])
        if type_ == "DELETED" or LABEL_SERVER in labels or not self.guards:
            self._drop_pod(key)
            return
        guard = self._guard_for(key[0], labels)
        found = engine_container(body.get("spec") or {}, guard.spec.container) if guard and guard.spec else None
        if guard is None or guard.spec is None or found is None:
            self._drop_pod(key)
            return
        container, argv = found
        ref = await asyncio.to_thread(self.owners.workload_of, body)
        wkey = (ref.kind, ref.name)
        home = self.pod_home.get(key)
        if home is not None and home != ((guard.namespace, guard.name), wkey):
            self._drop_pod(key)
        ws = guard.workloads.setdefault(wkey, WorkloadState(ref))
        annotations = meta.get("annotations") or {}
        image = str(container.get("image") or "")
        version, source = resolve_version(guard.spec, image, annotations)
        problem = None if version else version_problem(source, image, guard.spec.vllm_version.annotation)
        gp = GuardedPod(
            meta["name"],
            meta.get("uid", ""),
            str(container.get("name")),
            read_endpoint(argv).port,
            tuple(argv),
            version,
            source,
            problem,
            pod_summary(body, str(container.get("name"))),
        )
        if gp.summary["deleting"]:
            self._drop_pod(key)
            return
        ws.pods[gp.name] = gp
        self.pod_home[key] = ((guard.namespace, guard.name), wkey)
        self._known(ws, gp)  # KnownCrash findings, and the crash watch's evidence: what the launch line configures
        if not guard.feature("crash_watch"):
            return
        if self.rt.settings.stream_logs:  # the crash watch's log follower, for this pod's engine container
            self.rt.followers.ensure(key[0], body, gp.container)
        for death in deaths_in(body, gp.container):
            await asyncio.to_thread(self._crash, guard, ws, gp, death)

    def _drop_pod(self, key: tuple[str, str]) -> None:
        home = self.pod_home.pop(key, None)
        if home is None:
            return
        guard = self.guards.get(home[0])
        ws = guard.workloads.get(home[1]) if guard else None
        gp = ws.pods.pop(key[1], None) if ws is not None else None
        if gp is not None:
            self.rt.followers.stop(gp.uid)

    def _forget_workload(self, guard: GuardState, ws: WorkloadState) -> None:
        target = ws.ref.engine_target(guard.namespace)
        self.rt.acceptance.forget_target(target)
        self.probes.forget(target)
        for t in FINDING_TYPES:
            with contextlib.suppress(KeyError):
                telemetry.GUARD_FINDINGS.remove(guard.namespace, ws.ref.name, ws.ref.kind, t)

    # -------------------------------------------------------------------------------------- crash watch ---

    def _crash(self, guard: GuardState, ws: WorkloadState, gp: GuardedPod, death: Death) -> None:
        result = classify_death(self.rt, death, lambda: ws.evidence)
        if result is None:
            return
        sig = result.signature or "engine-dead"
        rule = result.upstream or sig
        k = (rule, death.pod)
        prev = ws.crashes.get(k)
        count = (prev.count or 0) + 1 if prev else 1
        hint = result.remediation.hint if result.remediation else None
        msg = f"engine died (restart {death.restart_count}, exit {death.exit_code}): {result.summary()}"
        if hint:
            msg += f". Remedy: {hint}"
        finding = Finding("CrashDiagnosed", msg, prev.since if prev else kube.now(), rule, death.pod, count)  # redacted
        ws.crashes[k] = finding
        ws.crash_at[k] = time.monotonic()
        telemetry.CRASHES.labels(guard.namespace, ws.ref.name, sig, result.upstream or "").inc()
        client.emit_event(ws.ref.event_target(guard.namespace), "EngineCrashed", f"pod {death.pod}: {finding.message}", "Warning")
        ws.reported.add(ws.crashes[k].key)
        log.info(
            "guard %s/%s: engine crash in %s %s pod %s restart %s: %s, count %s",
            guard.namespace, guard.name, ws.ref.kind, ws.ref.name, death.pod, death.restart_count, sig, count,
        )  # fmt: skip
        if count >= 2 and not result.generic:
            self._remediate(guard, ws, gp.name, gp.uid, f"crashed {count} times with {rule} (deterministic)")

    def _known(self, ws: WorkloadState, gp: GuardedPod) -> None:
        """KnownCrash findings: the pod's launch line evaluated by the rules (once per launch line and release)."""
        if ws.known_for == (gp.argv, gp.version):
            return
        ws.known_for, ws.known, ws.known_problem = (gp.argv, gp.version), [], None
        if gp.version is None:
            ws.known_problem = gp.version_problem
            return
        try:
            line, ev = evaluate_launch(list(gp.argv), vllm_version=gp.version, policy="reject")
        except Exception as e:  # noqa: BLE001 - ManifestError and what a foreign launch line may hold: reported
            ws.known_problem = f"launch line of {gp.name} not read: {e}"
            return
        ws.evidence = Evidence.from_spec(line.spec, gp.version)
        ws.served = line.endpoint.served_name or line.model
        ws.known = [
            Finding("KnownCrash", f.line(), kube.now(), f.rule) for f in ev.findings if f.action in ("rejected", "mitigated")
        ]

    # ---------------------------------------------------------------------------------------- remediation ---

    def _remediate(self, guard: GuardState, ws: WorkloadState, pod: str, uid: str, why: str) -> None:
        if not guard.delete_pods or uid in ws.remediated:
            return
        ws.remediated.add(uid)
        target = ws.ref.event_target(guard.namespace)
        if not self.rt.settings.guard_delete_pods:
            msg = f"pod {pod} {why}: remediation deletePod is not enabled in the operator (chart: GDN_GUARD_DELETE_PODS)"
            client.emit_event(target, "RemediationNotAllowed", msg, "Warning")
            log.info("guard %s/%s: %s", guard.namespace, guard.name, msg)
            return
        gone = client.delete_pod(guard.namespace, pod, uid)
        msg = f"deleted pod {pod} ({why}); its controller replaces it" if gone else f"pod {pod} ({why}) was already gone"
        client.emit_event(target, "PodDeleted", msg, "Warning")
        telemetry.REMEDIATIONS.labels(guard.namespace, ws.ref.name, why.split(" ", 1)[0], "delete-pod").inc()
        log.info("guard %s/%s: %s", guard.namespace, guard.name, msg)

    # ----------------------------------------------------------------------------------------------- rounds ---

    def _workloads_of(self, target: EngineTarget) -> list[WorkloadState]:
        """The guarded workload `target` (its kind and name) as each guard of its namespace holds it."""
        return [
            ws
            for g in self.guards.values()
            if g.namespace == target.namespace
            for ws in g.workloads.values()
            if (ws.ref.kind, ws.ref.name) == (target.kind, target.name)
        ]

    def probe_pods(self, target: EngineTarget) -> list[dict[str, Any]]:
        """The guarded workload's pods as the probe supervisor reads them (with each one's port)."""
        return api_pods([{**gp.summary, "port": gp.port} for ws in self._workloads_of(target) for gp in ws.pods.values()])

    def probe_result(self, target: EngineTarget, s: ServerProbes, body: dict[str, Any], cond: Condition) -> dict[str, Any] | None:
        """The probe supervisor's writer: OutputConsistent False is an OutputInconsistent finding (written with the
        guard's next round). Returns None: no GDNModelServer to remediate."""
        for ws in self._workloads_of(target):
            ws.probe = Finding("OutputInconsistent", cond.message, "", cond.reason) if cond.value is False else None
        return None

    def _configure_probes(self, guard: GuardState, ws: WorkloadState) -> None:
        """Track the workload's output probes (features.probes and spec.probes), once per guard generation."""
        spec = guard.spec.probes if guard.spec is not None and guard.feature("probes") else None
        target = ws.ref.engine_target(guard.namespace)
        cur = self.probes.servers.get(target)
        if spec is None:
            if cur is not None:
                self.probes.forget(target)
                ws.probe = None
            return
        if cur is not None and cur.generation == guard.generation:
            return
        s = ServerProbes(spec, guard.generation, model=ws.served or ws.ref.name)
        s.book = ProbeBook([q.name for q in spec.prompts], spec.failure_threshold)
        self.probes.configure(target, s)

    async def round(self, guard: GuardState) -> None:
        """Measure every guarded workload, collect findings, write status (when changed), Events for new ones."""
        views = []
        remedies: list[tuple[WorkloadState, GuardedPod, str]] = []
        quiet = self.rt.settings.crash_quiet_seconds
        now = time.monotonic()
        for wkey, ws in list(guard.workloads.items()):
            if not ws.pods:
                self._forget_workload(guard, ws)
                del guard.workloads[wkey]
                continue
            first = next(iter(ws.pods.values()))  # (pod events may change ws.pods while the round awaits)
            pods = len(ws.pods)
            stalled = await self._measure(guard, ws)
            remedies += [(ws, gp, "stalled") for gp in stalled]
            for k in [k for k, t in ws.crash_at.items() if now - t > quiet]:
                ws.crashes.pop(k, None)
                ws.crash_at.pop(k, None)
            self._configure_probes(guard, ws)
            probe = [self._since(ws, ws.probe)] if ws.probe is not None else []
            findings = (ws.known if guard.feature("admission") else []) + list(ws.crashes.values()) + ws.measured + probe
            self._report(guard, ws, findings)
            problems = [p for p in (ws.known_problem, first.version_problem) if p]
            views.append(
                WorkloadView(ws.ref.kind, ws.ref.name, first.version, first.version_source, pods, findings,
                             ws.acceptance, list(dict.fromkeys(problems)))
            )  # fmt: skip
        admission = self.rt.guard_admission.coverage(guard.namespace, guard.name) if guard.feature("admission") else None
        status = compose(guard.status, views, guard.generation, guard.problems, admission)
        fp = fingerprint(status)
        if fp != guard.written and await asyncio.to_thread(client.write_status, guard.namespace, guard.name, status):
            guard.status, guard.written = status, fp
            await asyncio.to_thread(self._publish_policy, guard.namespace)
        for ws, gp, why in remedies:  # after the status that shows why
            await asyncio.to_thread(self._remediate, guard, ws, gp.name, gp.uid, why)

    async def _measure(self, guard: GuardState, ws: WorkloadState) -> list[GuardedPod]:
        """Acceptance and stall findings of the round (ws.measured); the stalled pods."""
        ws.measured = []
        if not (guard.feature("acceptance") or guard.feature("stall")):
            return []
        pods = api_pods([gp.summary for gp in ws.pods.values()])
        port = next(iter(ws.pods.values())).port
        stalled: list[GuardedPod] = []
        target = ws.ref.engine_target(guard.namespace)
        m = await self.rt.acceptance.measure(target, pods, self.rt.settings.guard_stall_seconds, port)
        if guard.feature("acceptance"):
            a = m.acceptance
            keep = ("state", "rate", "rateDisplay", "meanAcceptedLength", "draftsPerSecond", "podsReporting", "updated")
            ws.acceptance = {k: a[k] for k in keep if a.get(k) is not None} or None
            for f in a.get("findings") or []:
                rule = (f.get("upstream") or [f.get("reason")])[0]
                ws.measured.append(self._since(ws, Finding("AcceptanceCollapsed", f"{f['reason']}: {f['message']}", "", rule)))
        if guard.feature("stall") and m.stall:
            for p in m.stall["stalled"]:
                msg = (
                    f"{p['running']} requests running, {p['waiting']} waiting, no progress for "
                    f"{p['secondsWithoutProgress']}s while /health answers"
                )
                ws.measured.append(self._since(ws, Finding("Stalled", msg, p.get("since") or "", "engine-stall", p["pod"])))
                gp = ws.pods.get(p["pod"])
                if gp is not None:
                    stalled.append(gp)
        return stalled

    @staticmethod
    def _since(ws: WorkloadState, f: Finding) -> Finding:
        """The finding with the time it was first seen (kept while it holds: an unchanged finding writes nothing)."""
        f.since = ws.first_seen.setdefault(f.key, f.since or kube.now())
        return f

    def _report(self, guard: GuardState, ws: WorkloadState, findings: list[Finding]) -> None:
        """Events on the workload for findings new this round, gdn_guard_findings, and forget the ones gone."""
        keys = {f.key for f in findings}
        target = ws.ref.event_target(guard.namespace)
        for f in findings:
            if f.key not in ws.reported:
                ws.reported.add(f.key)
                client.emit_event(target, f.type, (f"pod {f.pod}: " if f.pod else "") + f.message, "Warning")
                log.info("guard %s/%s: %s %s %s: %s", guard.namespace, guard.name, ws.ref.kind, ws.ref.name, f.type, f.message)
        for k in ws.reported - keys:
            ws.reported.discard(k)
            ws.first_seen.pop(k, None)
        for t in FINDING_TYPES:
            telemetry.GUARD_FINDINGS.labels(guard.namespace, ws.ref.name, ws.ref.kind, t).set(
                sum(1 for f in findings if f.type == t)
            )

    def _publish_policy(self, namespace: str) -> None:
        """The namespace's PolicyReport, when the CRD is served and its content changed."""
        if self.policy_absent_at is not None and time.monotonic() - self.policy_absent_at < _POLICY_RETRY:
            return
        results = []
        for (ns, name), g in sorted(self.guards.items()):
            if ns != namespace:
                continue
            for w in g.status.get("workloads") or []:
                ws = g.workloads.get((w["kind"], w["name"]))
                if ws is None:
                    continue
                for f in w.get("findings") or []:
                    results.append((name, ws.ref.event_target(ns), Finding(**f)))
        report = policy_report(namespace, results, 0)
        fp = repr(report)
        if self.policy_last.get(namespace) == fp:
            return
        report = policy_report(namespace, results, time.time())
        try:
            served = client.apply_policy_report(report)
        except Exception as e:  # noqa: BLE001 - a report is best effort: status and Events carry the findings
            log.warning("PolicyReport %s/%s not written: %s", namespace, report["metadata"]["name"], e)
            return
        if not served:
            log.info(
                "no PolicyReport (wgpolicyk8s.io/v1alpha2) written in %s: CRD not served or not permitted; findings are in "
                "GDNGuard status and Events",
                namespace,
            )
            self.policy_absent_at = time.monotonic()
            return
        self.policy_absent_at = None
        self.policy_last[namespace] = fp

    async def run(self) -> None:
        """Each guard's round every GDN_GUARD_INTERVAL seconds (rounds of different guards run at once)."""
        sem = asyncio.Semaphore(self.rt.settings.scrape_servers_concurrency)

        async def one(guard: GuardState) -> None:
            async with sem:
                try:
                    await self.round(guard)
                except Exception as e:  # noqa: BLE001 - a failed round is retried next interval
                    log.warning("guard round for %s/%s failed: %s", guard.namespace, guard.name, e)

        interval = self.rt.settings.guard_interval
        probes = asyncio.get_running_loop().create_task(tasks.supervised(self.probes.run, "guard-probes"), name="guard-probes")
        try:
            await self._rounds(one, interval)
        finally:
            probes.cancel()

    async def _rounds(self, one: Any, interval: float) -> None:
        while True:
            now = time.monotonic()
            due = [g for g in list(self.guards.values()) if g.next <= now]
            for g in due:
                g.next = now + interval
            if due:
                await asyncio.gather(*(one(g) for g in due))
            await asyncio.sleep(0.5)
