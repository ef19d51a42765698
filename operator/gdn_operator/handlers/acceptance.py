"""Speculative-decoding acceptance: one supervisor task scrapes each GDNModelServer's ready engine pods on
the spec's interval, feeds the shared sliding-window tracker, exports the gauges, and writes
status.acceptance plus the AcceptanceHealthy / MetricsAvailable conditions (Events on transitions).

All rounds share one aiohttp session (keep-alive pool, bounded concurrency), so one slow pod holds one
slot for at most the timeout and never delays other resources.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import kopf

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers import kube
from gdn_operator.handlers import status as st
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.watch.acceptance import AcceptanceTracker
from gdn_operator.watch.scraper import Scraper, Target

log = logging.getLogger(__name__)

METRICS_AVAILABLE = "MetricsAvailable"
ACCEPTANCE_REASONS = ("SpecAcceptanceNearZero", "SpecAcceptanceDrop", "EarlyStopShift")

TRACKER = AcceptanceTracker(window=float(os.environ.get("GDN_ACCEPTANCE_WINDOW", "300")))
_scraper: Scraper | None = None


def scraper() -> Scraper:
    global _scraper
    if _scraper is None:
        _scraper = Scraper(
            timeout=float(os.environ.get("GDN_SCRAPE_TIMEOUT", "5")),
            concurrency=int(os.environ.get("GDN_SCRAPE_CONCURRENCY", "64")),
        )
    return _scraper


def status_from_summary(summary: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Tracker summary (+ per-pod figures) → the status.acceptance object (api.models.AcceptanceStatus)."""
    rate = summary.get("acceptanceRate")
    out: dict[str, Any] = {
        "state": summary.get("state"),
        "rate": rate,
        "rateDisplay": f"{rate * 100:.1f}%" if rate is not None else None,
        "meanAcceptedLength": summary.get("meanAcceptedLength"),
        "perPosition": summary.get("perPosition") or [],
        "draftsPerSecond": summary.get("draftsPerSecond"),
        "windowSeconds": TRACKER.window,
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


def pod_figures(namespace: str, name: str, errors: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for pod in sorted(TRACKER.pods(namespace, name)):
        s = TRACKER.pod_stats((namespace, name, pod))
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


def write_acceptance(namespace: str, name: str, acceptance: dict[str, Any], targets: int, failed: dict[str, str]) -> list[tuple[str, str, str]]:
    """Write status; returns Events to emit (type, reason, message) for condition transitions."""
    events: list[tuple[str, str, str]] = []
    findings = acceptance.get("findings") or []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        gen = obj["metadata"].get("generation")
        status["acceptance"] = acceptance
        if targets:
            if len(failed) == targets:
                reasons = sorted(set(failed.values()))
                changed = st.set_condition(
                    status, METRICS_AVAILABLE, False, "ScrapeFailed",
                    f"no engine pod's /metrics could be read ({', '.join(reasons)})", gen,
                )
                if changed:
                    events.append(("Warning", "ScrapeFailed", f"/metrics unreachable on all {targets} engine pods ({', '.join(reasons)})"))
            else:
                msg = f"{targets - len(failed)}/{targets} engine pods scraped"
                if failed:
                    msg += "; failing: " + ", ".join(f"{p} ({r})" for p, r in sorted(failed.items())[:5])
                st.set_condition(status, METRICS_AVAILABLE, True, "Scraped", msg, gen)
        prev = st.get_condition(status, st.ACCEPTANCE) or {}
        state = acceptance.get("state")
        if findings:
            f = findings[0]
            reason = f["reason"]
            if st.set_condition(status, st.ACCEPTANCE, False, reason, f["message"], gen) and prev.get("reason") != reason:
                ups = f" ({', '.join(f['upstream'])})" if f.get("upstream") else ""
                events.append(("Warning", reason, f["message"] + ups))
            st.set_condition(status, st.DEGRADED, True, reason, f["message"], gen)
        else:
            # no finding: Ok → healthy; NotApplicable / NoTraffic / NoData / WarmingUp → unknown. Either way
            # an earlier acceptance alarm no longer holds (e.g. MTP was turned off in answer to it).
            if state == "Ok":
                st.set_condition(status, st.ACCEPTANCE, True, "AcceptanceOk", f"acceptance {acceptance.get('rateDisplay')}", gen)
            elif prev:
                st.set_condition(status, st.ACCEPTANCE, None, state or "NoData", f"acceptance state {state}", gen)
            d = st.get_condition(status, st.DEGRADED)
            if d and d.get("status") == "True" and d.get("reason") in ACCEPTANCE_REASONS:
                st.set_condition(status, st.DEGRADED, False, "AcceptanceRecovered", "", gen)
                events.append(("Normal", "AcceptanceRecovered", f"acceptance state {state}, {acceptance.get('rateDisplay') or 'no rate'}"))

    obj = kube.update_status(namespace, name, mutate)
    if obj is not None:
        for type_, reason, message in events:
            kube.emit_event(obj, reason, message, type_)
    return events


#: what was last written per resource (without the timestamp): unchanged figures are not rewritten, so
#: idle or pod-less servers cost no API calls per round
_LAST_WRITTEN: dict[tuple[str, str], str] = {}


def _fingerprint(acceptance: dict[str, Any], targets: int, failed: dict[str, str]) -> str:
    import json

    body = {k: v for k, v in acceptance.items() if k != "updated"}
    return json.dumps([body, targets, sorted(failed.items())], sort_keys=True, default=str)


async def scrape_round(namespace: str, name: str, pods: list[dict[str, Any]]) -> None:
    live = [p for p in pods if p.get("ip") and p.get("ready")]
    TRACKER.retain(namespace, name, [p["name"] for p in live])
    targets = [Target.for_pod(namespace, name, p["name"], p["ip"], ENGINE_PORT) for p in live]
    results = await scraper().scrape(targets) if targets else []
    failed: dict[str, str] = {}
    for r in results:
        TRACKER.observe_result(r)
        if not r.ok:
            failed[r.target.pod] = r.error or "error"
    TRACKER.update_baseline(namespace, name)  # the round's observations are in: maintain the auto baseline
    TRACKER.update_gauges(namespace, name)
    summary = TRACKER.summary(namespace, name)
    acceptance = status_from_summary(summary, pod_figures(namespace, name, failed))
    fp = _fingerprint(acceptance, len(targets), failed)
    if _LAST_WRITTEN.get((namespace, name)) == fp:
        return
    await asyncio.to_thread(write_acceptance, namespace, name, acceptance, len(targets), failed)
    _LAST_WRITTEN[(namespace, name)] = fp


class Registry:
    """Servers to scrape, fed by GDNModelServer events, driven by one supervisor task.

    (Not a kopf daemon or timer: those make kopf put a finalizer on every GDNModelServer, so deleting one
    would hang whenever the operator is down.)"""

    def __init__(self) -> None:
        from gdn_operator.handlers.probes import ProbeSupervisor

        self.servers: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods_index: Any = None
        self.task: asyncio.Task[None] | None = None
        self.probes = ProbeSupervisor(self.pods)  # output probes (handlers/probes.py) share the pod view

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        from gdn_operator.handlers.workload import pods_of

        return pods_of(self.pods_index, namespace, name) if self.pods_index is not None else []

    def track(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        spec = body.get("spec") or {}
        metrics = spec.get("metrics") or {}
        conds = {c.get("type"): c.get("status") for c in (body.get("status") or {}).get("conditions") or []}
        entry = self.servers.setdefault((namespace, name), {"next": 0.0})
        entry.update(
            interval=float(metrics.get("scrapeIntervalSeconds") or 15),
            enabled=bool(metrics.get("enabled", True)),
            crash_flagged=conds.get(st.CRASH_LOOPING) == "True" or conds.get(st.DEGRADED) == "True",
        )
        if not entry["enabled"] and entry.get("was_enabled"):
            entry["clear"] = True
        entry["was_enabled"] = entry["enabled"]

    def forget(self, namespace: str, name: str) -> None:
        self.servers.pop((namespace, name), None)
        self.probes.forget(namespace, name)
        TRACKER.forget_resource(namespace, name)
        _LAST_WRITTEN.pop((namespace, name), None)
        from gdn_operator import telemetry

        for gauge in (telemetry.READY_REPLICAS, telemetry.DESIRED_REPLICAS, telemetry.ENGINE_RESTARTS):
            try:
                gauge.remove(namespace, name)
            except KeyError:
                pass

    async def run(self) -> None:
        from gdn_operator.handlers.crashwatch import QUIET_CHECK_SECONDS, clear_crash_conditions
        from gdn_operator.handlers.workload import api_pods, pods_of

        sem = asyncio.Semaphore(int(os.environ.get("GDN_SCRAPE_RESOURCES_CONCURRENCY", "32")))
        next_quiet = 0.0

        async def one(ns: str, name: str) -> None:
            async with sem:
                try:
                    await scrape_round(ns, name, api_pods(pods_of(self.pods_index, ns, name)) if self.pods_index is not None else [])
                except Exception as e:  # noqa: BLE001 - a failed round is retried next interval
                    log.warning("acceptance round for %s/%s failed: %s", ns, name, e)

        while True:
            now = time.monotonic()
            tasks = []
            for (ns, name), entry in list(self.servers.items()):
                if entry.pop("clear", False):
                    tasks.append(asyncio.create_task(asyncio.to_thread(clear_acceptance, ns, name)))
                if entry["enabled"] and entry["next"] <= now:
                    entry["next"] = now + entry["interval"]
                    tasks.append(asyncio.create_task(one(ns, name)))
            if now >= next_quiet:
                next_quiet = now + QUIET_CHECK_SECONDS
                for (ns, name), entry in list(self.servers.items()):
                    if entry.get("crash_flagged"):
                        tasks.append(asyncio.create_task(asyncio.to_thread(clear_crash_conditions, ns, name)))
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.5)


REGISTRY = Registry()


def clear_acceptance(namespace: str, name: str) -> None:
    """Metrics turned off: acceptance figures and their conditions no longer say anything."""
    TRACKER.forget_resource(namespace, name)
    _LAST_WRITTEN.pop((namespace, name), None)

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        status.pop("acceptance", None)
        if st.get_condition(status, st.ACCEPTANCE) is not None:
            st.set_condition(status, st.ACCEPTANCE, None, "MetricsDisabled", "spec.metrics.enabled is false", gen)
        if st.get_condition(status, METRICS_AVAILABLE) is not None:
            st.set_condition(status, METRICS_AVAILABLE, None, "MetricsDisabled", "spec.metrics.enabled is false", gen)
        d = st.get_condition(status, st.DEGRADED)
        if d and d.get("status") == "True" and d.get("reason") in ACCEPTANCE_REASONS:
            st.set_condition(status, st.DEGRADED, False, "MetricsDisabled", "", gen)

    kube.update_status(namespace, name, mutate)


@kopf.on.event(GROUP, VERSION, PLURAL, id="acceptance-registry")
async def track_servers(
    type: str, body: kopf.Body, namespace: str | None, name: str, **kwargs: Any
) -> None:
    engine_pods: kopf.Index = kwargs["engine_pods"]  # kopf passes each index by its name (not in its handler protocols)
    namespace = kube.require_namespace(namespace)
    REGISTRY.pods_index = engine_pods  # a live view, refreshed by kopf
    if type == "DELETED" or body["metadata"].get("deletionTimestamp"):
        REGISTRY.forget(namespace, name)
        return
    plain = kube.plain(body)
    REGISTRY.track(namespace, name, plain)
    await REGISTRY.probes.track(namespace, name, plain)


@kopf.on.startup()
async def start_supervisor(**_: Any) -> None:
    REGISTRY.task = asyncio.get_running_loop().create_task(REGISTRY.run())
    REGISTRY.probes.task = asyncio.get_running_loop().create_task(REGISTRY.probes.run())


@kopf.on.cleanup()
async def stop_supervisor(**_: Any) -> None:
    for task in (REGISTRY.task, REGISTRY.probes.task):
        if task is not None:
            task.cancel()
