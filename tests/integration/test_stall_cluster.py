"""Stall detection on the real control plane (issue 24 item 6): kwok gives each engine pod a loopback IP, and
a stand-in engine bound to it serves a /metrics series replayed from tests/fixtures/stall/ (README there).

* the real TP=2 stall (counters nearly frozen with 8 running, /health 200): the operator flags it
  (condition Stalled, status.stall, Degraded, one Event, gdn_engine_stalled), restarts the pod once (the
  Deployment replaces it; status.remediations records it), and clears the condition when the replacement
  serves the healthy PIECEWISE series — with no second restart;
* the healthy, idle, long-prefill, slow-decode and restarting series (replayed 3x faster against a 60 s
  stallSeconds, i.e. the shapes against 180 s at a 15 s scrape granularity): never flagged, over the whole
  series.
"""

from __future__ import annotations

import errno
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stall_replay import MetricsStandIn  # noqa: E402

from operator_harness import Kube, gms, metric, running_operator, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(600)

PORT = 8000  # render/engine.py ENGINE_PORT
FAST = {"metrics": {"scrapeIntervalSeconds": 5}, "health": {"stallSeconds": 30}}
NEVER_SPEC = {"metrics": {"scrapeIntervalSeconds": 5}, "health": {"stallSeconds": 60}}
SPEED = 3.0


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-stall")) as proc:
        yield proc


def serve_on_pod(k: Kube, ns: str, name: str, series: str, **kw) -> MetricsStandIn:
    """A stand-in on the server's Ready pod. kwok hands out loopback IPs that another stand-in on this machine
    (another test session) may hold already: then that pod is deleted and its replacement, with another IP, used."""
    tried: list[str] = []
    for _ in range(4):
        pod = k.ready_pod(ns, name, not_named=tried[-1] if tried else None)
        try:
            return MetricsStandIn(pod.status.pod_ip, PORT, series, **kw)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            tried.append(pod.metadata.name)
            k.core.delete_namespaced_pod(pod.metadata.name, ns)
    raise AssertionError(f"no free loopback IP for a stand-in of {ns}/{name} after pods {tried}")


def test_stalled_engine_flagged_restarted_once_and_cleared(op, kube_api):
    k = Kube(kube_api)
    ns = k.create_namespace(f"stall-{uuid.uuid4().hex[:6]}")
    engines: dict[str, MetricsStandIn] = {}
    try:
        k.create(ns, gms("st", **FAST))
        k.wait_condition(ns, "st", "Ready", timeout=90)
        pod = k.ready_pod(ns, "st")
        ip = pod.status.pod_ip
        assert ip.startswith("127."), f"kwok pod IP {ip} is not loopback"
        # from the load's end on: 8, later 7, requests running, one engine step every ~20 s
        engines[ip] = MetricsStandIn(ip, PORT, "stalled-fullgraph-tp2", offset=60)
        gen = k.get(ns, "st")["metadata"]["generation"]

        c = k.wait_condition(ns, "st", "Stalled", "True", timeout=120, reason="EngineStalled")
        assert f"{pod.metadata.name}: 8 running, 0 waiting, no progress for" in c["message"]
        assert "/health still answers" in c["message"]
        d = k.condition(ns, "st", "Degraded")
        assert d["status"] == "True" and d["reason"] == "EngineStalled"
        (stalled,) = k.status(ns, "st")["stall"]["stalled"]
        assert stalled["pod"] == pod.metadata.name and stalled["running"] in (7, 8) and stalled["waiting"] == 0
        assert stalled["secondsWithoutProgress"] >= 30 and stalled["tokensPerRequestSecond"] < 0.5
        (ev,) = wait_for(lambda: k.events(ns, "st", "EngineStalled"), 15, what="EngineStalled Event")
        assert ev.type == "Warning"

        # ---- the restart: once, recorded, the Deployment replaces the pod ---------------------------
        rem = wait_for(lambda: (k.status(ns, "st").get("remediations") or [None])[-1], 30, what="the restart's record")
        assert (rem["signature"], rem["generation"], rem["action"]) == ("engine-stall", gen, f"restart {pod.metadata.name}")
        wait_for(lambda: k.events(ns, "st", "Remediated"), 15, what="Remediated Event")
        new = k.ready_pod(ns, "st", not_named=pod.metadata.name)
        assert k.get(ns, "st")["metadata"]["generation"] == gen  # the spec was not touched
        ip2 = new.status.pod_ip
        if ip2 in engines:  # 4x: its drain and idle tail in a minute
            engines[ip2].switch("healthy-piecewise-tp2", speed=4.0)
        else:
            engines[ip2] = MetricsStandIn(ip2, PORT, "healthy-piecewise-tp2", speed=4.0)
        c = k.wait_condition(ns, "st", "Stalled", "False", timeout=60, reason="EnginesProgressing")
        wait_for(lambda: k.events(ns, "st", "StallEnded"), 15, what="StallEnded Event")
        assert "stall" not in k.status(ns, "st")
        assert k.condition(ns, "st", "Degraded")["status"] == "False"
        # the healthy run drains and goes idle: the whole series seen, still not flagged, one restart only
        wait_for(lambda: engines[ip2].served_after_end >= 3, 150, interval=1, what="the healthy series replayed to its end")
        assert k.condition(ns, "st", "Stalled")["status"] == "False"
        assert len(k.events(ns, "st", "EngineStalled")) == 1 and len(k.events(ns, "st", "Remediated")) == 1
        assert len(k.status(ns, "st")["remediations"]) == 1
        text = op.metrics()
        assert metric(text, "gdn_engine_stalled", namespace=ns, server="st", pod=new.metadata.name) == 0
        assert metric(text, "gdn_engine_stalled", namespace=ns, server="st", pod=pod.metadata.name) is None  # gone
        assert op.alive()
    finally:
        for e in engines.values():
            e.close()
        k.delete_namespace(ns)


NEVER = ("healthy-piecewise-tp2", "idle", "long-prefill", "slow-decode", "restarting")


def test_healthy_idle_prefill_slow_restarting_never_flagged(op, kube_api):
    k = Kube(kube_api)
    ns = k.create_namespace(f"nostall-{uuid.uuid4().hex[:6]}")
    engines: dict[str, MetricsStandIn] = {}
    try:
        names = {series: f"n{i}" for i, series in enumerate(NEVER)}
        for name in names.values():
            k.create(ns, gms(name, **NEVER_SPEC))
        for series, name in names.items():
            k.wait_condition(ns, name, "Ready", timeout=90)
            engines[name] = serve_on_pod(k, ns, name, series, speed=SPEED)
        # positive evidence that each whole series was served and scraped past its end
        for name, eng in engines.items():
            try:
                wait_for(lambda e=eng: e.served_after_end >= 3, 180, interval=1, what=f"{name}: series replayed to its end")
            except AssertionError as e:
                raise AssertionError(f"{e}\nstatus: {k.status(ns, name)}\noperator log:\n{op.log_tail(80)}") from None
            wait_for(lambda n=name: k.condition(ns, n, "MetricsAvailable"), 30, what=f"{name} scraped")
        text = op.metrics()
        for series, name in names.items():
            assert k.condition(ns, name, "Stalled") is None, (series, k.condition(ns, name, "Stalled"))
            assert not k.events(ns, name, "EngineStalled"), series
            assert "stall" not in k.status(ns, name), series
            assert not (k.status(ns, name).get("remediations") or []), series
            assert metric(text, "gdn_engine_stalled", namespace=ns, server=name) == 0, series
    finally:
        for e in engines.values():
            e.close()
        k.delete_namespace(ns)
