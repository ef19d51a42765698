"""What an unauthenticated caller of the webhook port can cost (issue 48): the webhook front's and kopf's server's
requests are bounded in size (what the API server can send), in time (a read deadline), in number (reviews in
flight), and every malformed body is an HTTP 400, never a 500. The front runs here in-process on a real TLS port;
kopf's server (webhook/limits.BoundedWebhookServer) is driven through the same gate by its own test below. The
figures under a flood: bench/bench_webhook_flood.py."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest
from builders import server_review

from gdn_operator.handlers.webhook import admission

from gdn_operator.handlers.webhook import certs

from gdn_operator.handlers.webhook import limits as webhook_limits
from gdn_operator.handlers.core.kube import CrdCache
from gdn_operator.handlers.webhook.limits import MAX_BODY_BYTES, free_loopback_port
from gdn_operator.front import Front, FrontFacts
from gdn_operator.settings import Settings

FINE = {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "t", "vllmVersion": "0.32.0"}}


def review(spec: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return server_review(spec, uid, namespace="bounds-test")


def _bundle(d: Path) -> dict[str, str]:
    ca, crt, key = certs.new_bundle(["127.0.0.1", "localhost"]).write(d)
    return {"cert": str(crt), "key": str(key), "ca": str(ca)}


class Served:
    def __init__(self, front: Front, port: int, ca: str):
        self.front, self.port = front, port
        self.ctx = ssl.create_default_context(cafile=ca)
        self.url = f"https://127.0.0.1:{port}"

    async def post(self, path: str, data: bytes, timeout: float = 20) -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx)) as s,
            s.post(
                self.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(timeout)
            ) as r,
        ):
            return r.status, await r.read()

    async def raw(self, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TLS connection that has sent `head` (request line, headers, part of a body) and then says nothing."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.ctx, server_hostname="127.0.0.1")
        writer.write(head)
        await writer.drain()
        return reader, writer


async def _hanging_backend() -> tuple[asyncio.Server, int]:
    """A 'kopf server' that accepts connections and never answers (the front forwards to it and waits)."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def served_front(tmp_path: Path, backend_port: int = 1) -> tuple[Served, aiohttp.web.AppRunner]:
    c = _bundle(tmp_path)
    facts = FrontFacts(Settings.from_env({}), CrdCache())
    front = Front(facts, backend=f"https://127.0.0.1:{backend_port}", cert=c["cert"], key=c["key"], ca=c["ca"])
    runner = aiohttp.web.AppRunner(front.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    port = free_loopback_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port, ssl_context=front.server_context).start()
    return Served(front, port, c["ca"]), runner


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.timeout(60)
async def test_every_malformed_body_is_a_400_and_a_valid_review_is_still_answered(tmp_path):
    served, runner = await served_front(tmp_path)
    try:
        path = f"/{admission.VALIDATE_ID}"
        bad = [
            b'{"request": {"uid": "u", "x": ' + b"9" * 5000 + b"}}",  # past int's digit limit: ValueError, was HTTP 500
            b"{not json",
            b"[1, 2, 3]",
            b'{"request": "x"}',
            b'{"request": {"uid": 5, "object": {}}}',
            b'{"request": {"uid": "u", "object": [1]}}',
            b'{"request": {"uid": "u", "resource": "gdnmodelservers", "object": {}}}',
            b"\xff\xfe\x00",
        ]
        for body in bad:
            status, text = await served.post(path, body)
            assert status == 400, (body[:60], status, text[:200])
        status, text = await served.post(path, json.dumps(review(FINE)).encode())
        assert status == 200 and json.loads(text)["response"] == {"uid": "u-1", "allowed": True}
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_a_body_past_what_the_api_server_sends_is_refused_before_it_is_read(tmp_path):
    served, runner = await served_front(tmp_path)
    try:
        # declared: refused on the headers, nothing read (the connection sends no body at all)
        reader, writer = await served.raw(_head(f"/{admission.VALIDATE_ID}", MAX_BODY_BYTES + 1))
        line = await asyncio.wait_for(reader.readline(), 5)
        assert b" 413 " in line, line
        writer.close()
        # chunked (no length): refused as soon as it passes the limit (was: 16 MiB read and decoded)
        big = json.dumps(review({**FINE, "pad": "x" * (MAX_BODY_BYTES + 1024)})).encode()
        status, _ = await served.post(f"/{admission.VALIDATE_ID}", big)
        assert status == 413
        assert MAX_BODY_BYTES < 7 * 1024 * 1024  # an UPDATE of two objects at the API server's 3 MiB limit, no more
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_a_slow_body_is_cut_off_at_the_read_deadline(tmp_path, monkeypatch):
    served, runner = await served_front(tmp_path)
    served.front.gate.read_seconds = 1.0
    try:
        reader, writer = await served.raw(_head(f"/{admission.VALIDATE_ID}", 1000) + b'{"request": ')
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        line = await asyncio.wait_for(reader.readline(), 8)  # was: held forever
        assert b" 408 " in line, line
        assert loop.time() - t0 < 3
        writer.close()
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_reviews_in_flight_are_capped(tmp_path):
    """Every slot held by a review whose answer hangs (a forwarded one, kopf's server not answering): one more
    review waits for a turn until its read deadline, then gets 503, instead of piling up without bound."""
    backend, bport = await _hanging_backend()
    served, runner = await served_front(tmp_path, backend_port=bport)
    served.front.gate = webhook_limits.ReviewGate(limit=2, read_seconds=1.0)
    try:
        held = [asyncio.create_task(served.post("/gdn-guard-admission", b'{"request": {"uid": "h"}}', 20)) for _ in range(2)]
        await asyncio.sleep(0.5)
        status, _ = await served.post(f"/{admission.VALIDATE_ID}", json.dumps(review(FINE)).encode())
        assert status == 503
        for t in held:
            t.cancel()
    finally:
        await runner.cleanup()
        backend.close()


@pytest.mark.timeout(60)
async def test_slow_bodies_hold_no_turn_and_held_bytes_are_budgeted(tmp_path):
    """Slow bodies (a slowloris) take no turn of the reviews that arrived: with 2 turns and 20 slow connections a
    valid review is answered at once. The bytes they hold count against the budget: past it, 503."""
    served, runner = await served_front(tmp_path)
    served.front.gate = webhook_limits.ReviewGate(limit=2, read_seconds=5.0, held_budget=256 * 1024)
    conns = []
    try:
        for _ in range(20):
            conns.append(await served.raw(_head(f"/{admission.VALIDATE_ID}", 10_000) + b'{"request": '))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        status, text = await served.post(f"/{admission.VALIDATE_ID}", json.dumps(review(FINE)).encode())
        assert status == 200 and loop.time() - t0 < 2, (status, loop.time() - t0)
        # one slow body holding 200 KiB of the 256 KiB budget: a 100 KiB review finds no room
        conns.append(await served.raw(_head(f"/{admission.VALIDATE_ID}", 300_000) + b"x" * 200_000))
        await asyncio.sleep(0.5)
        status, _ = await served.post(f"/{admission.VALIDATE_ID}", json.dumps(review({**FINE, "pad": "y" * 100_000})).encode())
        assert status == 503
    finally:
        for _, w in conns:
            w.close()
        await runner.cleanup()


@pytest.mark.timeout(120)
async def test_kopfs_server_in_the_operators_process_has_the_same_bounds(tmp_path):
    """webhook.process: operator (kopf's server answers every review, the guard webhook's too): the same gate. A
    5000-digit integer is a 400 (was 500), a body past the limit 413, and the guard route answers a valid review."""
    from gdn_operator.handlers.webhook.limits import BoundedWebhookServer

    c = _bundle(tmp_path)
    port = free_loopback_port()
    server = BoundedWebhookServer(addr="127.0.0.1", port=port, host="127.0.0.1", certfile=c["cert"], pkeyfile=c["key"])

    async def fn(request: Any, **_: Any) -> dict[str, Any]:  # kopf's side: never reached by a malformed body
        raise AssertionError(f"kopf was handed {str(request)[:80]}")

    async def guard_route(review: dict[str, Any]) -> dict[str, Any]:
        return {"response": {"uid": review["request"]["uid"], "allowed": True}}

    server.routes["gdn-guard-admission"] = guard_route
    async with server:
        cfg = await asyncio.wait_for(server(fn).__anext__(), 60)
        ctx = ssl.create_default_context(cafile=c["ca"])
        url = cfg["url"].rstrip("/")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:

            async def post(body: bytes) -> tuple[int, bytes]:
                async with s.post(f"{url}/gdn-guard-admission", data=body) as r:
                    return r.status, await r.read()

            assert (await post(b'{"request": {"uid": "u", "x": ' + b"9" * 5000 + b"}}"))[0] == 400
            assert (await post(b'{"request": []}'))[0] == 400
            assert (await post(b"x" * (MAX_BODY_BYTES + 1)))[0] == 413
            status, text = await post(json.dumps({"request": {"uid": "g-1", "object": {}}}).encode())
            assert status == 200 and json.loads(text)["response"] == {"uid": "g-1", "allowed": True}
