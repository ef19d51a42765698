"""Speculative-decoding acceptance: one supervisor task scrapes each GDNModelServer's ready engine pods on
the spec's interval, feeds the sliding-window tracker and the stall watch (handlers/engines/stall.py: the same
scrape, parsed once), exports the gauges, and writes status.acceptance and status.stall plus the
AcceptanceHealthy / MetricsAvailable / Stalled conditions in one status write (Events on transitions). The supervisor's state
(tracker, scraper, what was last written, the servers and their pods) lives in one AcceptanceSupervisor,
held by the runtime (handlers/runtime.py).

All rounds share one aiohttp session (keep-alive pool, bounded concurrency), so one slow pod holds one
slot for at most the timeout and never delays other resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from gdn_operator import telemetry
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.pods import api_pods, pods_of
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines import stall as stall_watch
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.watch.acceptance import AcceptanceTracker, PodKey
from gdn_operator.watch.scraper import MetricsSource, Target
from gdn_operator.watch.target import SERVER_KIND, EngineTarget

log = logging.getLogger(__name__)


def status_from_summary(summary: dict[str, Any], pods: list[dict[str, Any]], window: float) -> dict[str, Any]:
    """Tracker summary (+ per-pod figures) → the status.acceptance object (api.status.AcceptanceStatus)."""
    rate = summary.get("acceptanceRate")
    out: dict[str, Any] = {
        "state": summary.get("state"),
        "rate": rate,
        "rateDisplay": f"{rate * 100:.1f}%" if rate is not None else None,
        "meanAcceptedLength": summary.get("meanAcceptedLength"),
        "perPosition": summary.get("perPosition") or [],
        "draftsPerSecond": summary.get("draftsPerSecond"),
        "windowSeconds": window,
        "observedSeconds": summary.get("observedSeconds"),
        "baselineRate": summary.get("baselineAcceptanceRate"),
        "stopShare": summary.get("stopShare"),
        "meanGenerationLength": summary.get("meanGenerationLength"),
        "podsReporting": (summary.get("pods") or {}).get("reporting"),
        "scrapeErrors": (summary.get("pods") or {}).get("scrapeErrors"),
        "updated": kube.now(),
        "findings": (summary.get("findings") or [])[:16],
        "pods": pods[:64],
    }
    return {k: v for k, v in out.items() if v is not None}


def pod_figures(tracker: AcceptanceTracker, target: EngineTarget, errors: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for pod in sorted(tracker.pods(target)):
        s = tracker.pod_stats(PodKey(target, pod))
        entry: dict[str, Any] = {"pod": pod}
        if s is not None:
            for key, val in (
                ("acceptanceRate", s.acceptance_rate),
                ("meanAcceptedLength", s.mean_accepted_length),
                ("draftsPerSecond", s.drafts_per_second),
            ):
                if val is not None:
                    entry[key] = round(val, 4)
        if pod in errors:
            entry["error"] = errors[pod]
        out.append(entry)
    return out


def write_acceptance(
    namespace: str,
    name: str,
    acceptance: dict[str, Any],
    targets: int,
    failed: dict[str, str],
    stall: dict[str, Any] | None,
    bodies: Servers,
) -> tuple[list[tuple[str, str, str]], dict[str, Any] | None]:
    """Write status (from `bodies`' newest server body: no read); returns the Events emitted (type,
    reason, message) for condition transitions, and the server as written (None when it is gone)."""
    events: list[tuple[str, str, str]] = []
    findings = acceptance.get("findings") or []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        gen = obj["metadata"].get("generation")
        status["acceptance"] = acceptance
        events.extend(stall_watch.apply_condition(status, stall, gen))
        if targets:
            if len(failed) == targets:
                reasons = sorted(set(failed.values()))
                changed = st.set_condition(
                    status,
                    st.METRICS_AVAILABLE,
                    False,
                    "ScrapeFailed",
                    f"no engine pod's /metrics could be read ({', '.join(reasons)})",
                    gen,
                )
                if changed:
                    events.append(
                        ("Warning", "ScrapeFailed", f"/metrics unreachable on all {targets} engine pods ({', '.join(reasons)})")
                    )
            else:
                msg = f"{targets - len(failed)}/{targets} engine pods scraped"
                if failed:
                    msg += "; failing: " + ", ".join(f"{p} ({r})" for p, r in sorted(failed.items())[:5])
                st.set_condition(status, st.METRICS_AVAILABLE, True, "Scraped", msg, gen)
        prev = st.get_condition(status, st.ACCEPTANCE) or {}
        state = acceptance.get("state")
        if findings:  # AcceptanceHealthy False degrades the server (conditions.refresh_degraded)
            f = findings[0]
            reason = f["reason"]
            if st.set_condition(status, st.ACCEPTANCE, False, reason, f["message"], gen) and prev.get("reason") != reason:
                ups = f" ({', '.join(f['upstream'])})" if f.get("upstream") else ""
                events.append(("Warning", reason, f["message"] + ups))
        else:
            # no finding: Ok → healthy; NotApplicable / NoTraffic / NoData / WarmingUp → unknown. Either way
            # an earlier acceptance alarm no longer holds (e.g. MTP was turned off in answer to it).
            if state == "Ok":
                st.set_condition(status, st.ACCEPTANCE, True, "AcceptanceOk", f"acceptance {acceptance.get('rateDisplay')}", gen)
            elif prev:
                st.set_condition(status, st.ACCEPTANCE, None, state or "NoData", f"acceptance state {state}", gen)
            if prev.get("status") == "False" and prev.get("reason") in st.ACCEPTANCE_REASONS:
                events.append(
                    ("Normal", "AcceptanceRecovered", f"acceptance state {state}, {acceptance.get('rateDisplay') or 'no rate'}")
                )

    obj = bodies.update_status(namespace, name, mutate)
    if obj is not None:
        for type_, reason, message in events:
            if reason in (st.STALL_REASON, "StallEnded"):
                log.info("%s/%s: %s: %s", namespace, name, reason, message)
            kube.emit_event(obj, reason, message, type_)
    return events, obj


def _fingerprint(acceptance: dict[str, Any], targets: int, failed: dict[str, str], stall: dict[str, Any] | None) -> str:
    body = {k: v for k, v in acceptance.items() if k != "updated"}
    return json.dumps([body, targets, sorted(failed.items()), stall], sort_keys=True, default=str)


@dataclass(frozen=True)
class Measurement:
    """One scrape round's figures for a target: status.acceptance, the pods scraped, those that failed (pod →
    reason), status.stall (None: nothing stalled) and each scraped pod's stall verdict."""

    acceptance: dict[str, Any]
    targets: int
    failed: dict[str, str]
    stall: dict[str, Any] | None
    verdicts: list[stall_watch.PodVerdict]


class AcceptanceSupervisor:
    """Servers to scrape, fed by GDNModelServer events, driven by one supervisor task.

    (Not a kopf daemon or timer: those make kopf put a finalizer on every GDNModelServer, so deleting one
    would hang whenever the operator is down.)"""

    def __init__(self, tracker: AcceptanceTracker, scraper: MetricsSource, concurrency: int, bodies: Servers) -> None:
        self.tracker = tracker
        #: the newest server bodies seen (handlers/core/servers.py): status writes from them need no read
        self.bodies = bodies
        self.scraper = scraper
        self.stall = stall_watch.StallWatch()
        #: supporting evidence for a stall, per engine pod: hang wording in the pod's log (the crash watch's log
        #: followers, by namespace and pod) and output-probe timeouts (the probe supervisor, by target and pod);
        #: set by the runtime
        self.hang_of: Any = lambda namespace, pod: ""
        self.probe_timeouts_of: Any = lambda target, pod: 0
        self.plan_inputs: Any = None  # the runtime (settings, CRDs): renders the stall ladder's override at once
        self.concurrency = concurrency  # servers whose round runs at once
        #: the GDNModelServers to scrape (schedule and settings), by namespace and name: servers only, so the name
        #: is the server's; the engine state they share with guarded workloads (the tracker's windows, the stall
        #: detectors) is keyed by EngineTarget, kind included
        self.servers: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods_index: Any = None  # kopf's live engine_pods index (handlers/core/pods.py), set by the first event
        #: what was last written per server (without the timestamp): unchanged figures are not rewritten, so
        #: idle or pod-less servers cost no API calls per round
        self.last_written: dict[tuple[str, str], str] = {}
        self.task: asyncio.Task[None] | None = None

    def pods(self, target: EngineTarget) -> list[dict[str, Any]]:
        """The engine pods of the GDNModelServer `target` (kopf's index holds the operator's own pods only)."""
        if self.pods_index is None or target.kind != SERVER_KIND:
            return []
        return pods_of(self.pods_index, target.namespace, target.name)

    def track(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        metrics = (body.get("spec") or {}).get("metrics") or {}
        entry = self.servers.setdefault((namespace, name), {"next": 0.0})
        health = (body.get("spec") or {}).get("health") or {}
        entry.update(
            interval=float(metrics.get("scrapeIntervalSeconds") or 15),
            enabled=bool(metrics.get("enabled", True)),
            stall_seconds=float(health.get("stallSeconds") or stall_watch.DEFAULT_STALL_SECONDS),
        )
        if not entry["enabled"] and entry.get("was_enabled"):
            entry["clear"] = True
        entry["was_enabled"] = entry["enabled"]
        # the first round waits for the reconcile's status write (observedGeneration): written before it, the
        # round's patch and the reconcile's would race, one of them read again and repeated
        entry["reconciled"] = "observedGeneration" in (body.get("status") or {})

    def forget(self, namespace: str, name: str) -> None:
        target = EngineTarget.server(namespace, name)
        self.servers.pop((namespace, name), None)
        self.stall.forget(target)
        self.tracker.forget_resource(target)
        self.last_written.pop((namespace, name), None)
        for gauge in (telemetry.READY_REPLICAS, telemetry.DESIRED_REPLICAS, telemetry.ENGINE_RESTARTS):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)

    async def measure(
        self, target: EngineTarget, pods: list[dict[str, Any]], stall_seconds: float, port: int = ENGINE_PORT
    ) -> Measurement:
        """One scrape of the target's ready engine pods (a GDNModelServer, or a workload a GDNGuard guards),
        fed to the acceptance tracker and the stall detectors, the gdn_* gauges set; the figures for status.
        The one measuring path of both kinds of target."""
        live = [p for p in pods if p.get("ip") and p.get("ready")]
        tracker = self.tracker
        tracker.retain(target, [p["name"] for p in live])
        targets = [Target.for_pod(target, p["name"], p["ip"], port) for p in live]
        results = await self.scraper.scrape(targets) if targets else []
        failed: dict[str, str] = {}
        for r in results:
            tracker.observe_result(r)
            if not r.ok:
                failed[r.target.pod] = r.error or "error"
        tracker.update_baseline(target)  # the round's observations are in: maintain the auto baseline
        tracker.update_gauges(target)
        summary = tracker.summary(target)
        acceptance = status_from_summary(summary, pod_figures(tracker, target, failed), tracker.window)
        verdicts = self.stall.observe_round(target, stall_seconds, live, results)
        stall = stall_watch.stall_status(
            verdicts,
            stall_seconds,
            lambda pod: self.hang_of(target.namespace, pod),
            lambda pod: self.probe_timeouts_of(target, pod),
        )
        return Measurement(acceptance, len(targets), failed, stall, verdicts)

    def forget_target(self, target: EngineTarget) -> None:
        """A guarded workload no longer guarded: its tracker windows and stall detectors (and their gauges) go."""
        self.stall.forget(target)
        self.tracker.forget_resource(target)

    async def scrape_round(self, namespace: str, name: str, pods: list[dict[str, Any]]) -> None:
        stall_seconds = float(
            (self.servers.get((namespace, name)) or {}).get("stall_seconds") or stall_watch.DEFAULT_STALL_SECONDS
        )
        m = await self.measure(EngineTarget.server(namespace, name), pods, stall_seconds)
        acceptance, targets, failed, stall, verdicts = m.acceptance, m.targets, m.failed, m.stall, m.verdicts
        fp = _fingerprint(acceptance, targets, failed, stall)
        if self.last_written.get((namespace, name)) == fp:
            return
        if not targets and stall is None and self._says_nothing_yet(namespace, name):
            # no engine pod to scrape and no figures in status to correct: a "NoData" block would be one more
            # status write per new server (bench/bench_reconcile.py), telling nothing the conditions don't
            self.last_written[(namespace, name)] = fp
            return
        _, obj = await asyncio.to_thread(write_acceptance, namespace, name, acceptance, targets, failed, stall, self.bodies)
        self.last_written[(namespace, name)] = fp
        if obj is not None and stall is not None:
            stalled = [pv for pv in verdicts if pv.verdict.stalled]
            await asyncio.to_thread(
                stall_watch.end_stall,
                namespace,
                name,
                obj,
                stalled,
                stall_watch.condition_message(stall),
                self.stall.restarted,
                self.plan_inputs,
                self.bodies,
            )

    def _says_nothing_yet(self, namespace: str, name: str) -> bool:
        """Whether the server's newest known status holds no acceptance figures and none of the conditions this
        round writes (False when no body is known: then the round writes as before)."""
        body = self.bodies.get(namespace, name)
        if body is None:
            return False
        status = body.get("status") or {}
        return "acceptance" not in status and not any(
            st.get_condition(status, c) for c in (st.ACCEPTANCE, st.METRICS_AVAILABLE, st.STALLED)
        )

    def clear(self, namespace: str, name: str) -> None:
        """Metrics turned off: acceptance figures and their conditions no longer say anything."""
        target = EngineTarget.server(namespace, name)
        self.tracker.forget_resource(target)
        self.stall.forget(target)
        self.last_written.pop((namespace, name), None)
        clear_acceptance(namespace, name, self.bodies)

    async def run(self) -> None:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(ns: str, name: str) -> None:
            async with sem:
                try:
                    await self.scrape_round(ns, name, api_pods(self.pods(EngineTarget.server(ns, name))))
                except Exception as e:  # noqa: BLE001 - a failed round is retried next interval
                    log.warning("acceptance round for %s/%s failed: %s", ns, name, e)

        try:
            while True:
                now = time.monotonic()
                tasks = []
                for (ns, name), entry in list(self.servers.items()):
                    if entry.pop("clear", False):
                        tasks.append(asyncio.create_task(asyncio.to_thread(self.clear, ns, name)))
                    if entry["enabled"] and entry.get("reconciled", True) and entry["next"] <= now:
                        entry["next"] = now + entry["interval"]
                        tasks.append(asyncio.create_task(one(ns, name)))
                if tasks:
                    for r in await asyncio.gather(*tasks, return_exceptions=True):
                        if isinstance(r, Exception):
                            log.warning("clearing acceptance status failed: %s", r)
                await asyncio.sleep(0.5)
        finally:
            await self.scraper.close()


def clear_acceptance(namespace: str, name: str, bodies: Servers) -> None:
    """Metrics turned off: drop status.acceptance and set its conditions Unknown."""

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        status.pop("acceptance", None)
        if st.get_condition(status, st.ACCEPTANCE) is not None:
            st.set_condition(status, st.ACCEPTANCE, None, "MetricsDisabled", "spec.metrics.enabled is false", gen)
        if st.get_condition(status, st.METRICS_AVAILABLE) is not None:
            st.set_condition(status, st.METRICS_AVAILABLE, None, "MetricsDisabled", "spec.metrics.enabled is false", gen)
        stall_watch.metrics_disabled(status, gen)

    bodies.update_status(namespace, name, mutate)
