"""Resilience details (issue 11 §7): request timeouts on the sync client, log followers that survive an
API-server outage."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import kubernetes
import pytest
import urllib3

from gdn_operator.handlers.servers import Servers
from gdn_operator.handlers import kube, logfollow


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (a frozen API server)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(2)
    for c in conns:
        c.close()
    srv.close()


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
