"""Scraper against real local aiohttp servers on 127.0.0.1 serving the REAL captured exposition:
concurrency bound, per-request timeout, slow pod isolation, error reasons, telemetry."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from gdn_operator import telemetry
from gdn_operator.watch.acceptance import AcceptanceTracker, parse_exposition
from gdn_operator.watch.target import EngineTarget
from gdn_operator.watch.scraper import (
    ScrapeResult,
    Scraper,
    Target,
    scrape_and_observe,
    scrape_many,
)

from paths import CPU_CAPTURES

BODY = (CPU_CAPTURES / "metrics-mtp2.prom").read_bytes()

pytestmark = pytest.mark.timeout(60)


class StandIn:
    """One aiohttp server with per-path behaviour; counts in-flight requests."""

    def __init__(self):
        self.inflight = 0
        self.max_inflight = 0
        self.hits = 0
        self.clients: list[tuple[str, int]] = []  # the client end (host, port) of every request
        app = web.Application(middlewares=[self.record_client])
        app.router.add_get("/ok/{i}", self.ok)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/slowbody", self.slowbody)
        app.router.add_get("/held/{i}", self.held)
        app.router.add_get("/500", self.err)
        app.router.add_get("/garbage", self.garbage)
        app.router.add_get("/big", self.big)
        app.router.add_get("/bigchunked", self.bigchunked)
        app.router.add_get("/gzip", self.gzipped)
        self.app = app

    async def start(self):
        self.runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self):
        await self.runner.cleanup()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    @web.middleware
    async def record_client(self, request, handler):
        self.clients.append(request.transport.get_extra_info("peername")[:2])
        return await handler(request)

    async def ok(self, request):
        self.hits += 1
        return web.Response(body=BODY, content_type="text/plain")

    async def slow(self, request):
        await asyncio.sleep(30)
        return web.Response(body=BODY)

    async def slowbody(self, request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(BODY[:1000])
        await asyncio.sleep(30)
        return resp

    async def held(self, request):
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await asyncio.sleep(0.05)
            return web.Response(body=BODY)
        finally:
            self.inflight -= 1

    async def err(self, request):
        return web.Response(status=500, text="engine dead")

    async def garbage(self, request):
        return web.Response(body=BODY.replace(b'engine="0",model_name', b'engine="0" model_name', 1))

    async def big(self, request):
        return web.Response(body=BODY * 10)

    async def bigchunked(self, request):  # no Content-Length: the cap is checked while reading
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(BODY)
        return resp

    async def gzipped(self, request):  # Content-Length is the compressed size: read through the capped loop
        resp = web.Response(body=BODY, content_type="text/plain")
        resp.enable_compression(web.ContentCoding.gzip)
        return resp


@pytest.fixture
async def server():
    s = await StandIn().start()
    yield s
    await s.stop()


from controlplane import free_port  # noqa: E402  (tests/cluster is on sys.path via tests/conftest.py)


def T(url, pod="p0", name="m"):
    return Target(EngineTarget.server("ns", name), pod, url)


async def test_scrape_ok_parses_real_exposition(server):
    res = await scrape_many([T(server.url("/ok/0"))], timeout=5, concurrency=4)
    assert len(res) == 1 and isinstance(res[0], ScrapeResult)
    r = res[0]
    assert r.ok and r.status == 200 and r.error is None
    assert r.snapshot.num_drafts == 156.0 and r.snapshot.num_draft_tokens == 312.0
    assert r.snapshot.accepted_per_position == (0.0, 0.0)
    assert abs(r.snapshot.timestamp - time.time()) < 5


async def test_slow_pod_times_out_without_delaying_others(server):
    targets = [T(server.url("/slow"), pod="slow"), T(server.url("/slowbody"), pod="slowbody")] + [
        T(server.url(f"/ok/{i}"), pod=f"p{i}") for i in range(20)
    ]
    timeout = 2.0
    t0 = time.monotonic()
    res = await scrape_many(targets, timeout=timeout, concurrency=4)
    wall = time.monotonic() - t0
    assert [r.target.pod for r in res] == [t.pod for t in targets]  # order preserved
    assert res[0].error == "timeout" and res[0].snapshot is None
    assert res[1].error == "timeout"
    assert f"{timeout:g}s" in res[0].message
    # the 20 fast pods all succeed: they are served by the two free slots while the slow ones hang
    assert all(r.ok for r in res[2:])
    # Had the slow pods delayed the others (serial scraping, or fast pods queued behind them), the
    # round would take at least two timeouts; isolated, it takes one timeout plus a little.
    assert wall < 1.8 * timeout, wall


async def test_concurrency_is_bounded(server):
    targets = [T(server.url(f"/held/{i}"), pod=f"p{i}") for i in range(24)]
    res = await scrape_many(targets, timeout=5, concurrency=3)
    assert all(r.ok for r in res)
    assert server.max_inflight == 3


async def test_unreachable_port_is_connect_error_not_exception():
    port = free_port()
    res = await scrape_many([T(f"http://127.0.0.1:{port}/metrics")], timeout=2, concurrency=1)
    assert res[0].error == "connect" and res[0].snapshot is None and res[0].status is None
    assert res[0].message


async def test_http_error_parse_error_and_bad_url(server):
    res = await scrape_many(
        [
            T(server.url("/500"), pod="a"),
            T(server.url("/garbage"), pod="b"),
            T(server.url("/missing"), pod="c"),
            T("not a url", pod="d"),
        ],
        timeout=2,
        concurrency=4,
    )
    by = {r.target.pod: r for r in res}
    assert by["a"].error == "http" and by["a"].status == 500 and "500" in by["a"].message
    assert by["b"].error == "parse" and by["b"].status == 200
    assert by["c"].error == "http" and by["c"].status == 404
    assert by["d"].error == "connect" and "not a url" in by["d"].message


async def test_body_size_cap(server):
    chunked = await scrape_many([T(server.url("/bigchunked"))], timeout=5, concurrency=1, max_bytes=len(BODY) * 2)
    assert chunked[0].error == "http" and "exceeds" in chunked[0].message
    gz = await scrape_many([T(server.url("/gzip"))], timeout=5, concurrency=1)
    assert gz[0].ok and gz[0].snapshot == parse_exposition(BODY, gz[0].snapshot.timestamp)
    res = await scrape_many([T(server.url("/big"))], timeout=5, concurrency=1, max_bytes=len(BODY) * 2)
    assert res[0].error == "http" and "exceeds" in res[0].message


async def test_telemetry_records_errors_and_durations(server):
    reg = telemetry.METRICS_REGISTRY
    lab = {"namespace": "tele", "server": "m", "reason": "timeout"}
    before_err = reg.get_sample_value("gdn_scrape_errors_total", lab) or 0.0
    before_n = reg.get_sample_value("gdn_scrape_duration_seconds_count") or 0.0
    targets = [
        Target(EngineTarget.server("tele", "m"), "slow", server.url("/slow")),
        Target(EngineTarget.server("tele", "m"), "ok", server.url("/ok/1")),
    ]
    await scrape_many(targets, timeout=0.3, concurrency=2)
    assert reg.get_sample_value("gdn_scrape_errors_total", lab) == before_err + 1
    assert reg.get_sample_value("gdn_scrape_duration_seconds_count") == before_n + 2


async def test_scraper_reuses_session_and_feeds_tracker(server):
    tr = AcceptanceTracker(window=300)
    targets = [T(server.url(f"/ok/{i}"), pod=f"p{i}") for i in range(3)] + [T(server.url("/500"), pod="dead")]
    async with Scraper(timeout=2, concurrency=8) as sc:
        await scrape_and_observe(tr, sc, targets)
        n1 = len(server.clients)
        await asyncio.sleep(0.01)
        await scrape_and_observe(tr, sc, targets[:2])  # p2 and dead disappeared
    first, second = set(server.clients[:n1]), set(server.clients[n1:])
    # the session was reused: round two went over kept-alive connections of round one, no new ones
    assert n1 == 4 and len(server.clients) == 6, server.clients
    assert second and second <= first, (first, second)
    assert sorted(tr.pods(EngineTarget.server("ns", "m"))) == ["p0", "p1"]
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["pods"]["total"] == 2 and s["pods"]["reporting"] == 2
    # the stand-in serves constant counters: drafts flow 0 in the window → NoTraffic, not 0 %
    assert s["state"] == "NoTraffic" and s["acceptanceRate"] is None


def test_target_for_pod():
    assert Target.for_pod(EngineTarget.server("ns", "m"), "p", "10.0.0.7").url == "http://10.0.0.7:8000/metrics"
    assert Target.for_pod(EngineTarget.server("ns", "m"), "p", "fd00::1", 9000).url == "http://[fd00::1]:9000/metrics"
    assert Target.for_pod(EngineTarget.server("ns", "m"), "p", "10.0.0.7").key == (EngineTarget.server("ns", "m"), "p")


def test_bad_parameters_rejected():
    with pytest.raises(ValueError, match="timeout"):
        Scraper(timeout=0)
    with pytest.raises(ValueError, match="concurrency"):
        Scraper(concurrency=0)


async def test_parsing_runs_off_the_event_loop_within_a_cpu_budget(server):
    """Issue 48: /metrics bodies (up to 16 MiB x 64 in flight) were parsed on the event loop. They are parsed in one
    worker thread, and once the parsing CPU of the window is spent, a body is a `parse` error for the round instead
    of more CPU; the cap on a body is 4 MiB (a vLLM /metrics is a few hundred KiB)."""
    import threading

    from gdn_operator.watch import scraper as scraper_mod

    assert scraper_mod.DEFAULT_MAX_BYTES <= 4 * 1024 * 1024
    loop_thread = threading.get_ident()
    seen = []
    async with Scraper(timeout=5, concurrency=2) as s:

        class Recording:
            def __init__(self, reader):
                self.reader = reader

            def parse(self, body, timestamp=None):
                seen.append(threading.get_ident())
                return self.reader.parse(body, timestamp=timestamp)

        s._reader = Recording(s._reader)
        (r,) = await s.scrape([T(server.url("/ok/0"))])
        assert r.ok and seen and loop_thread not in seen
        s.budget = scraper_mod.ParseBudget(share=0.0, window=10.0)  # nothing left to spend
        (r,) = await s.scrape([T(server.url("/ok/0"))])
        assert r.error == "parse" and "budget" in r.message and len(seen) == 1
