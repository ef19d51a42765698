"""Speculative-decoding acceptance: one kopf daemon per GDNModelServer scrapes its ready engine pods on
the spec's interval, feeds the shared sliding-window tracker, exports the gauges, and writes
status.acceptance plus the AcceptanceHealthy / MetricsAvailable conditions (Events on transitions).

All daemons share one aiohttp session (keep-alive pool, bounded concurrency), so one slow pod holds one
slot for at most the timeout and never delays other resources.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers import kube
from gdn_operator.handlers import status as st
from gdn_operator.handlers.workload import pods_of
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.watch.acceptance import AcceptanceTracker
from gdn_operator.watch.scraper import Scraper, Target

log = logging.getLogger(__name__)

METRICS_AVAILABLE = "MetricsAvailable"

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
        if findings:
            f = findings[0]
            reason = f["reason"]
            if st.set_condition(status, st.ACCEPTANCE, False, reason, f["message"], gen) and prev.get("reason") != reason:
                ups = f" ({', '.join(f['upstream'])})" if f.get("upstream") else ""
                events.append(("Warning", reason, f["message"] + ups))
            st.set_condition(status, st.DEGRADED, True, reason, f["message"], gen)
        elif acceptance.get("state") == "Ok":
            st.set_condition(status, st.ACCEPTANCE, True, "AcceptanceOk", f"acceptance {acceptance.get('rateDisplay')}", gen)
            d = st.get_condition(status, st.DEGRADED)
            if d and d.get("status") == "True" and d.get("reason") in ("SpecAcceptanceNearZero", "SpecAcceptanceDrop", "EarlyStopShift"):
                st.set_condition(status, st.DEGRADED, False, "AcceptanceRecovered", "", gen)
                events.append(("Normal", "AcceptanceRecovered", f"acceptance back to {acceptance.get('rateDisplay')}"))

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
    TRACKER.update_gauges(namespace, name)
    summary = TRACKER.summary(namespace, name)
    acceptance = status_from_summary(summary, pod_figures(namespace, name, failed))
    fp = _fingerprint(acceptance, len(targets), failed)
    if _LAST_WRITTEN.get((namespace, name)) == fp:
        return
    await asyncio.to_thread(write_acceptance, namespace, name, acceptance, len(targets), failed)
    _LAST_WRITTEN[(namespace, name)] = fp


@kopf.daemon(GROUP, VERSION, PLURAL, id="acceptance", cancellation_timeout=5.0)
async def acceptance_loop(
    stopped: kopf.DaemonStopped, namespace: str, name: str, spec: kopf.Spec, engine_pods: kopf.Index,
    logger: logging.Logger, **_: Any,
) -> None:
    try:
        while not stopped:
            metrics = spec.get("metrics") or {}
            interval = float(metrics.get("scrapeIntervalSeconds") or 15)
            if metrics.get("enabled", True):
                try:
                    await scrape_round(namespace, name, pods_of(engine_pods, namespace, name))
                except Exception as e:  # noqa: BLE001 - a failed round is retried next interval
                    logger.warning("acceptance round failed: %s", e)
            await stopped.wait(interval)
    finally:
        TRACKER.forget_resource(namespace, name)
        _LAST_WRITTEN.pop((namespace, name), None)
