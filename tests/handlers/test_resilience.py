"""Resilience details (issue 11 §7): request timeouts on the sync client, log followers that survive an
API-server outage."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import kubernetes
import pytest
import urllib3
import waiting

from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.engines import logfollow


@contextlib.contextmanager
def _tcp_server(reply: bytes | None):
    """A TCP server on a free port; each connection gets `reply` after its request (None: never answers, nor reads)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c = srv.accept()[0]
            except OSError:
                continue
            conns.append(c)
            if reply is not None:
                c.recv(65536)  # the request
                c.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        for c in conns:
            c.close()
        srv.close()


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (a frozen API server)."""
    with _tcp_server(None) as url:
        yield url


def _client(host: str) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = host
    return kubernetes.client.ApiClient(cfg)


def test_requests_without_a_timeout_get_the_default(silent_server):
    client = _client(silent_server)
    kube.with_default_timeout(client.rest_client, (1.0, 0.5))
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
        kubernetes.client.CoreV1Api(client).list_namespace(_preload_content=False)
    assert isinstance(e.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert time.monotonic() - t0 < 10


def test_an_explicit_timeout_is_kept(silent_server):
    client = _client(silent_server)
    kube.with_default_timeout(client.rest_client, (1.0, 30.0))
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        kubernetes.client.CoreV1Api(client).list_namespace(_preload_content=False, _request_timeout=(1, 0.3))
    assert time.monotonic() - t0 < 10


def test_instance_state_is_unknown_not_gone_when_the_api_server_is_away(monkeypatch):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens: connection refused
    client = _client(f"http://127.0.0.1:{port}")
    client.configuration.retries = 0
    monkeypatch.setattr(kube, "api_client", lambda: client)
    assert logfollow._instance_running("ns", "pod", "uid", 0) is None


def test_log_follower_retries_through_an_outage_then_ends_with_the_instance(monkeypatch):
    answers = iter([None, None, True, False])  # outage, outage, back (still running), instance ended
    calls = {"stream": 0, "check": 0}

    def stream_once(*_a, **_k):
        calls["stream"] += 1
        raise urllib3.exceptions.MaxRetryError(None, "/", "connection refused")

    def instance_running(*_a):
        calls["check"] += 1
        return next(answers)

    async def no_sleep(_s):
        return None

    monkeypatch.setattr(logfollow, "_stream_once", stream_once)
    monkeypatch.setattr(logfollow, "_instance_running", instance_running)
    monkeypatch.setattr(logfollow.asyncio, "sleep", no_sleep)
    monkeypatch.setattr(logfollow, "evidence_for", lambda servers, ns, name: None)  # no API server to read the spec from
    with ThreadPoolExecutor(4) as pool:
        followers = logfollow.LogFollowers(pool, logfollow.StreamedResults(), Servers())
        asyncio.run(asyncio.wait_for(followers._follow("ns", "pod", "uid", 0, "srv"), 10))
    assert calls == {"stream": 4, "check": 4}


@pytest.fixture
def quiet_log_server():
    """An HTTP server that answers a log request with headers and then nothing: a followed log of a quiet engine."""
    with _tcp_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n") as url:
        yield url


def test_shutdown_ends_the_blocked_read_of_a_quiet_followed_log(monkeypatch, quiet_log_server):
    """A thread reading a quiet engine's followed log blocks up to its 600 s read timeout, and the interpreter joins
    executor threads at exit: the operator's shutdown (LogFollowers.stop_all) must end those reads."""
    monkeypatch.setattr(kube, "api_client", lambda: _client(quiet_log_server))
    streams = logfollow.OpenStreams()
    state = logfollow.StreamState(logfollow.StreamClassifier(), lambda _r: None)
    out: list[object] = []

    def follow() -> None:
        try:
            out.append(logfollow._stream_once("ns", "pod", lambda: False, lambda _g: None, state, "engine", streams))
        except Exception as e:  # noqa: BLE001 - how the read ended is not the point: that it ended
            out.append(e)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    waiting.wait_for(lambda: len(streams) == 1, 10, interval=0.05, what="the log stream open and blocked in its read")
    t.join(0.5)
    assert t.is_alive(), "the read of a quiet log must block until shut down"
    assert streams.shutdown_all() == 1
    t.join(5)
    assert not t.is_alive(), "the blocked read outlived the shutdown"
    assert out and len(streams) == 0

    # a stream opened after the shutdown (a task that was about to open one) ends at once
    t2 = threading.Thread(target=follow, daemon=True)
    t2.start()
    t2.join(5)
    assert not t2.is_alive() and len(out) == 2
