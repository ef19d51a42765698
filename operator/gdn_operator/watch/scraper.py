"""Concurrent, bounded scraper of vLLM engine /metrics endpoints.

    results = await scrape_many(targets, timeout=5.0, concurrency=64)

or, to reuse keep-alive connections across rounds (what the operator's timer should do)::

    async with Scraper(timeout=5.0, concurrency=64) as scraper:
        while True:
            results = await scraper.scrape(targets)
            ...

Guarantees:
* at most ``concurrency`` requests in flight; each request (connect + headers + body) is bounded by
  ``timeout`` seconds, measured from when it gets a slot, so one slow pod holds one slot for at most
  ``timeout`` and never delays the others;
* every target yields exactly one :class:`ScrapeResult`, in the order of ``targets``; failures are
  results with ``error`` in {"timeout", "connect", "http", "parse"} and a one-line ``message`` —
  this module never raises for an unreachable or broken pod (only cancellation propagates);
* a body past ``max_bytes`` (DEFAULT_MAX_BYTES: a vLLM /metrics is a few hundred KiB) is an ``http`` error, unread;
* parsing runs off the event loop, one body at a time in one worker thread, and within a CPU budget
  (PARSE_CPU_SHARE of a core over PARSE_WINDOW_SECONDS): a target whose body would be parsed past it is a ``parse``
  error for the round (issue 48: 64 pods answering 16 MiB each were parsed on the event loop);
* each scrape is recorded in ``gdn_scrape_duration_seconds`` and each failure in
  ``gdn_scrape_errors_total{namespace,name,reason}`` (gdn_operator.telemetry).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from gdn_operator import telemetry
from gdn_operator.watch.acceptance import (
    AcceptanceTracker,
    EngineSnapshot,
    ExpositionParseError,
    ExpositionReader,
    PodKey,
)
from gdn_operator.watch.target import EngineTarget

__all__ = [
    "ERROR_CONNECT",
    "ERROR_HTTP",
    "ERROR_PARSE",
    "ERROR_TIMEOUT",
    "MetricsSource",
    "ScrapeResult",
    "Scraper",
    "Target",
    "scrape_and_observe",
    "scrape_many",
]

ERROR_TIMEOUT = "timeout"
ERROR_CONNECT = "connect"
ERROR_HTTP = "http"
ERROR_PARSE = "parse"

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
#: the share of one core parsing may take, measured over the window (the parsing thread's CPU time)
PARSE_CPU_SHARE = 0.25
PARSE_WINDOW_SECONDS = 10.0


class ParseBudget:
    """CPU seconds spent parsing within the last `window` seconds, at most `share` x `window`."""

    def __init__(self, share: float = PARSE_CPU_SHARE, window: float = PARSE_WINDOW_SECONDS) -> None:
        self.limit, self.window = share * window, window
        self._spent: collections.deque[tuple[float, float]] = collections.deque()

    def spent(self, now: float) -> float:
        while self._spent and now - self._spent[0][0] > self.window:
            self._spent.popleft()
        return sum(cpu for _, cpu in self._spent)

    def allows(self, now: float) -> bool:
        return self.spent(now) < self.limit

    def charge(self, now: float, cpu: float) -> None:
        self._spent.append((now, cpu))


_HEADERS = {"Accept": "text/plain;version=0.0.4", "User-Agent": "gdn-operator-scraper"}


@dataclass(frozen=True, slots=True)
class Target:
    """One engine pod to scrape. ``url`` is the full metrics URL, e.g. http://10.0.0.7:8000/metrics."""

    owner: EngineTarget  # the GDNModelServer or guarded workload whose engine pod this is
    pod: str
    url: str

    @property
    def namespace(self) -> str:
        return self.owner.namespace

    @property
    def name(self) -> str:
        return self.owner.name

    @property
    def key(self) -> PodKey:
        return PodKey(self.owner, self.pod)

    @classmethod
    def for_pod(cls, owner: EngineTarget, pod: str, ip: str, port: int = 8000, path: str = "/metrics") -> Target:
        host = f"[{ip}]" if ":" in ip else ip
        return cls(owner, pod, f"http://{host}:{port}{path}")


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    target: Target
    snapshot: EngineSnapshot | None  # None on failure
    error: str | None = None  # timeout | connect | http | parse
    message: str = ""
    status: int | None = None  # HTTP status if a response arrived
    duration: float = 0.0  # seconds spent on the request (excluding the wait for a slot)

    @property
    def ok(self) -> bool:
        return self.error is None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


class MetricsSource(Protocol):
    """Where a round's engine snapshots come from: :class:`Scraper` (each engine's /metrics) or
    ``watch/promsource.py``'s PrometheusSource (one query for all engines)."""

    async def scrape(self, targets: Sequence[Target]) -> list[ScrapeResult]: ...

    async def close(self) -> None: ...


class Scraper:
    """Holds one aiohttp session (keep-alive pool) for repeated scrape rounds."""

    def __init__(
        self,
        timeout: float = 5.0,
        concurrency: int = 64,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        record_metrics: bool = True,
        session: aiohttp.ClientSession | None = None,
    ):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.timeout = float(timeout)
        self.concurrency = int(concurrency)
        self.max_bytes = int(max_bytes)
        self.record_metrics = record_metrics
        self._session = session
        self._own_session = session is None
        self._reader = ExpositionReader()  # remembers label sets across pods and rounds (one parse at a time)
        self._parser = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gdn-metrics-parse")
        self.budget = ParseBudget()

    async def __aenter__(self) -> Scraper:
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency,
                limit_per_host=0,
                ttl_dns_cache=300,
                keepalive_timeout=60.0,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=_HEADERS,
                auto_decompress=True,
                # Per-request deadline is enforced by asyncio.timeout in _fetch; this is a backstop.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
            )
            self._own_session = True
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()
        self._parser.shutdown(wait=False, cancel_futures=True)

    def _parse(self, body: bytes, timestamp: float) -> tuple[EngineSnapshot | None, str, float]:
        """Parse in the worker thread: (the snapshot, or None and the parse error's first line; the thread's CPU
        seconds it took)."""
        t0 = time.thread_time()
        try:
            return self._reader.parse(body, timestamp=timestamp), "", time.thread_time() - t0
        except ExpositionParseError as exc:
            return None, str(exc).splitlines()[0], time.thread_time() - t0

    async def scrape(self, targets: Sequence[Target]) -> list[ScrapeResult]:
        """Scrape every target once; one result per target, same order."""
        session = self._ensure_session()
        sem = asyncio.Semaphore(self.concurrency)

        async def run(t: Target) -> ScrapeResult:
            async with sem:
                return await self._scrape_one(session, t)

        return list(await asyncio.gather(*(run(t) for t in targets)))

    async def _scrape_one(self, session: aiohttp.ClientSession, target: Target) -> ScrapeResult:
        t0 = time.perf_counter()
        status: int | None = None
        error: str | None = None
        message = ""
        body = b""
        try:
            async with asyncio.timeout(self.timeout):
                async with session.get(target.url, allow_redirects=False) as resp:
                    status = resp.status
                    if status != 200:
                        error, message = ERROR_HTTP, f"HTTP {status} {resp.reason or ''}".strip()
                    elif resp.content_length is not None and resp.content_length > self.max_bytes:
                        error = ERROR_HTTP
                        message = f"body of {resp.content_length} bytes exceeds {self.max_bytes}"
                    elif resp.content_length is not None and "Content-Encoding" not in resp.headers:
                        # bounded by the length checked above (a compressed body is not): one read, no chunk loop
                        body = await resp.read()
                    else:
                        chunks: list[bytes] = []
                        size = 0
                        async for chunk in resp.content.iter_any():
                            size += len(chunk)
                            if size > self.max_bytes:
                                error, message = ERROR_HTTP, f"body exceeds {self.max_bytes} bytes"
                                break
                            chunks.append(chunk)
                        else:
                            body = b"".join(chunks)
        except TimeoutError:
            error, message = ERROR_TIMEOUT, f"no complete response within {self.timeout:g}s"
        except (aiohttp.ClientConnectionError, OSError) as exc:
            # ClientConnectorError, ServerDisconnectedError, ClientOSError, connection refused/reset
            error, message = ERROR_CONNECT, _one_line(exc)
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            error, message = ERROR_HTTP, _one_line(exc)
        except (aiohttp.InvalidURL, ValueError) as exc:
            error, message = ERROR_CONNECT, f"bad target URL {target.url!r}: {_one_line(exc)}"
        except Exception as exc:  # noqa: BLE001 - a broken pod must never break the round
            error, message = ERROR_CONNECT, _one_line(exc)
        duration = time.perf_counter() - t0

        snapshot = None
        if error is None and not self.budget.allows(time.monotonic()):
            spent = self.budget.spent(time.monotonic())
            error = ERROR_PARSE
            message = f"not parsed: /metrics parsing took {spent:.1f} CPU s in the last {self.budget.window:.0f} s (the budget)"
        elif error is None:
            loop = asyncio.get_running_loop()
            snapshot, why, cpu = await loop.run_in_executor(self._parser, self._parse, body, time.time())
            self.budget.charge(time.monotonic(), cpu)
            if snapshot is None:
                error, message = ERROR_PARSE, why
        if self.record_metrics:
            telemetry.SCRAPE_DURATION.observe(duration)
            if error is not None:
                telemetry.SCRAPE_ERRORS.labels(target.namespace, target.name, error).inc()
        return ScrapeResult(target, snapshot, error, message, status, duration)


async def scrape_many(
    targets: Sequence[Target],
    timeout: float = 5.0,
    concurrency: int = 64,
    *,
    session: aiohttp.ClientSession | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[ScrapeResult]:
    """Scrape ``targets`` concurrently (at most ``concurrency`` at once, ``timeout`` s each).

    Uses ``session`` if given (left open), else a temporary session closed on return.
    """
    scraper = Scraper(timeout, concurrency, max_bytes=max_bytes, session=session)
    try:
        return await scraper.scrape(targets)
    finally:
        await scraper.close()


def observe_results(tracker: AcceptanceTracker, results: Iterable[ScrapeResult]) -> None:
    for r in results:
        tracker.observe_result(r)


async def scrape_and_observe(tracker: AcceptanceTracker, scraper: Scraper, targets: Sequence[Target]) -> list[ScrapeResult]:
    """One timer round: scrape, feed the tracker, forget pods no longer targeted for each resource
    present in ``targets``. Returns the results (for logging/events)."""
    results = await scraper.scrape(targets)
    observe_results(tracker, results)
    live: dict[EngineTarget, set[str]] = {}
    for t in targets:
        live.setdefault(t.owner, set()).add(t.pod)
    for owner, pods in live.items():
        tracker.retain(owner, pods)
    return results
