"""Engine counters read from a Prometheus the cluster already runs, instead of scraping every engine.

    source = PrometheusSource("http://prometheus-operated.monitoring.svc:9090", timeout=5.0)
    results = await source.scrape(targets)   # the same ScrapeResults as Scraper.scrape, one per target
    await source.close()

Where a Prometheus already scrapes the engines (the operator's PodMonitors, or the chart's global one), the
operator need not fetch ~55 KB from each of them every round: KEDA's Prometheus scaler and Dynamo's planner read
engine load the same way (../shared/docs/anchors.md, A12 and C4). Set ``GDN_METRICS_PROMETHEUS`` (chart:
``monitoring.readFromPrometheus.address``); unset, the operator scrapes the engines itself (``watch/scraper.py``).

One round is two instant queries for ALL the namespaces asked for, whatever the number of engines:

* the samples: every series of the names ``parse.py`` reads (:data:`SAMPLE_NAMES`, with the ``vllm:`` or
  ``vllm_`` prefix or none), in those namespaces, with only the labels that fold reads (:data:`KEPT_LABELS`);
* their scrape time: ``timestamp()`` of the pod's ``up`` series, the newest per pod. A snapshot is stamped with the
  time the engine was scraped, not the time of the query, so a round that sees the same scrape twice (a
  Prometheus interval longer than the operator's) adds no point to a window (duplicate timestamps are ignored
  there) and rates are over the engine's own scrape times.

Series map to targets by their ``namespace`` and ``pod`` labels (what the pod role of a PodMonitor attaches) and
fold into snapshots by :func:`~gdn_operator.watch.acceptance.snapshot_from_samples`, the rules of the text
parser. A pod with no series gets ``connect`` ("Prometheus has no series for it": not scraped yet, selected
by no PodMonitor, or down, when Prometheus marks its series stale); Prometheus unreachable, slow or answering
an error gives every target of the round ``connect`` / ``timeout`` / ``http`` with Prometheus's own message.

The acceptance supervisor runs one round per server; calls within ``max_age`` seconds that need no namespace
the last answer lacks share that answer (and one query in flight), so 1,000 servers cost a few queries per
interval, not 1,000.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from gdn_operator import telemetry
from gdn_operator.watch.acceptance import SAMPLE_NAMES, EngineSnapshot, snapshot_from_samples
from gdn_operator.watch.scraper import ERROR_CONNECT, ERROR_HTTP, ERROR_TIMEOUT, ScrapeResult, Target

__all__ = ["KEPT_LABELS", "PrometheusSource", "samples_query", "timestamps_query"]

_NAMES = "vllm[:_]?(?:" + "|".join(SAMPLE_NAMES) + ")"  # [a-z_] only: nothing to escape


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _namespaces(namespaces: Sequence[str]) -> str:
    bad = [n for n in namespaces if not _NAMESPACE.fullmatch(n)]
    if bad:  # Kubernetes namespaces are DNS labels: nothing in them is special in a PromQL regex or string
        raise ValueError(f"not a namespace name: {bad[0]!r}")
    return "|".join(sorted(set(namespaces)))


#: the labels a series keeps in the answer: those the fold reads and the pod's; the ones a PodMonitor adds
#: (job, instance, container, endpoint, service) are summed away, a third of the answer's bytes
KEPT_LABELS = ("__name__", "namespace", "pod", "engine", "model_name", "position", "finished_reason", "le")


def samples_query(namespaces: Sequence[str]) -> str:
    """PromQL: every sample the operator reads, of every engine pod in ``namespaces``."""
    selector = f'{{__name__=~"{_NAMES}",namespace=~"{_namespaces(namespaces)}",pod!=""}}'
    return f"sum by ({', '.join(KEPT_LABELS)}) ({selector})"


def timestamps_query(namespaces: Sequence[str]) -> str:
    """PromQL: the newest scrape time of each engine pod in ``namespaces`` (seconds since the epoch): the time
    of its target's ``up`` series, which every sample of that scrape carries (``timestamp()`` of the samples
    themselves would drop their names and collide)."""
    return f'max by (namespace, pod) (timestamp(up{{namespace=~"{_namespaces(namespaces)}",pod!=""}}))'


class _Answer:
    """One round's answer: samples and scrape time per (namespace, pod), or the error every target gets."""

    __slots__ = ("at", "namespaces", "snapshots", "error", "message", "duration")

    def __init__(self, at: float, namespaces: frozenset[str]) -> None:
        self.at = at
        self.namespaces = namespaces
        self.snapshots: dict[tuple[str, str], EngineSnapshot] = {}  # only pods with samples and a scrape time
        self.error: str | None = None
        self.message = ""
        self.duration = 0.0


class PrometheusSource:
    """Reads engine counters from Prometheus's HTTP API; the scrape interface of :class:`~.scraper.Scraper`."""

    def __init__(
        self,
        address: str,
        timeout: float = 5.0,
        *,
        max_age: float = 5.0,
        record_metrics: bool = True,
        session: aiohttp.ClientSession | None = None,
    ):
        if not address.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus address must be an http(s) URL, got {address!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.url = address.rstrip("/") + "/api/v1/query"
        self.timeout = float(timeout)
        self.max_age = float(max_age)
        self.record_metrics = record_metrics
        self._session = session
        self._own_session = session is None
        self._answer: _Answer | None = None
        self._pending: asyncio.Task[_Answer] | None = None

    async def close(self) -> None:
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"User-Agent": "gdn-operator-prometheus-source"})
            self._own_session = True
        return self._session

    async def scrape(self, targets: Sequence[Target]) -> list[ScrapeResult]:
        """One result per target, same order (never raises for Prometheus's failures)."""
        if not targets:
            return []
        answer = await self._answer_for(frozenset(t.namespace for t in targets))
        out = []
        for t in targets:
            key = (t.namespace, t.pod)
            if answer.error is not None:
                r = ScrapeResult(t, None, answer.error, answer.message, None, answer.duration)
            elif key not in answer.snapshots:
                msg = f"Prometheus has no series for pod {t.namespace}/{t.pod} (not scraped yet, or stale)"
                r = ScrapeResult(t, None, ERROR_CONNECT, msg, None, answer.duration)
            else:
                r = ScrapeResult(t, answer.snapshots[key], None, "", 200, answer.duration)
            if self.record_metrics and r.error is not None:
                telemetry.SCRAPE_ERRORS.labels(t.namespace, t.name, r.error).inc()
            out.append(r)
        return out

    async def _answer_for(self, namespaces: frozenset[str]) -> _Answer:
        a = self._answer
        if a is not None and namespaces <= a.namespaces and time.monotonic() - a.at < self.max_age:
            return a
        pending = self._pending
        if pending is not None and not pending.done():
            a = await asyncio.shield(pending)
            if namespaces <= a.namespaces:
                return a
        # ask for every namespace asked for lately, so the servers of the other namespaces share this answer
        wanted = namespaces | (self._answer.namespaces if self._answer is not None else frozenset())
        self._answer = None  # not held while the next one is decoded
        self._pending = asyncio.ensure_future(self._query(wanted))
        self._answer = await asyncio.shield(self._pending)
        return self._answer

    async def _query(self, namespaces: frozenset[str]) -> _Answer:
        answer = _Answer(time.monotonic(), namespaces)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                samples, times = await asyncio.gather(
                    self._get(samples_query(sorted(namespaces))), self._get(timestamps_query(sorted(namespaces)))
                )
        except TimeoutError:
            answer.error, answer.message = ERROR_TIMEOUT, f"Prometheus {self.url}: no answer within {self.timeout:g}s"
        except (aiohttp.ClientConnectionError, OSError) as exc:
            answer.error, answer.message = ERROR_CONNECT, f"Prometheus {self.url}: {type(exc).__name__}: {exc}"
        except (aiohttp.ClientResponseError, ValueError) as exc:
            answer.error, answer.message = ERROR_HTTP, f"Prometheus {self.url}: {exc}"
        else:
            pods: dict[tuple[str, str], list[tuple[str, dict[str, str], float]]] = {}
            for series in samples:
                m = series.get("metric") or {}
                key = (m.get("namespace", ""), m.get("pod", ""))
                pods.setdefault(key, []).append((m.get("__name__", ""), m, _number(series)))
            del samples  # the decoded answer: the snapshots below are all that is kept
            for series in times:
                m = series.get("metric") or {}
                key = (m.get("namespace", ""), m.get("pod", ""))
                if key in pods:
                    answer.snapshots[key] = snapshot_from_samples(pods.pop(key), _number(series))
        answer.duration = time.perf_counter() - t0
        if self.record_metrics:
            telemetry.SCRAPE_DURATION.observe(answer.duration)
        return answer

    async def _get(self, query: str) -> list[dict[str, Any]]:
        session = self._ensure_session()
        async with session.post(self.url, data={"query": query}, allow_redirects=False) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            if not isinstance(body, dict) or body.get("status") != "success":
                detail = body.get("error") if isinstance(body, dict) else (await resp.text())[:200]
                raise ValueError(f"HTTP {resp.status}: {detail}")
            data = body.get("data") or {}
            if data.get("resultType") != "vector":
                raise ValueError(f"expected a vector, got {data.get('resultType')!r}")
            result: list[dict[str, Any]] = data.get("result") or []
            return result


def _number(series: dict[str, Any]) -> float:
    """The value of one instant-vector series (Prometheus writes it as a string: "1.5", "NaN", "+Inf")."""
    try:
        return float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan
