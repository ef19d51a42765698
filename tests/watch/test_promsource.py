"""Engine counters read from the REAL Prometheus server (tests/cluster/build.sh monitoring: cmd/prometheus built
from source) scraping stand-in engines that serve the real captured vLLM expositions (issue 37 item 7).

Prometheus scrapes them with a static configuration carrying the ``namespace`` and ``pod`` labels a PodMonitor's
pod role attaches; :class:`PrometheusSource` must then give, per target, the snapshot the operator's own scrape
of that body gives (``parse_exposition``), stamped with Prometheus's scrape time, in one pair of queries for all
engines (counted from Prometheus's own ``prometheus_http_requests_total`` on its /metrics).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gdn_operator.settings import Settings, SettingsError
from gdn_operator.watch.acceptance import parse_exposition
from gdn_operator.watch.target import EngineTarget
from gdn_operator.watch.promsource import PrometheusSource, samples_query, timestamps_query
from gdn_operator.watch.scraper import ERROR_CONNECT, Target
from metrics_standin import MetricsServer
from monitoring import PrometheusServer, find_monitoring
from paths import CPU_CAPTURES, REPO, SHARED_FIXTURES
from waiting import wait_for

NS = "serving"
BODIES = {  # pod -> a real exposition
    "cpu-0": (CPU_CAPTURES / "metrics-mtp2.prom").read_text(),
    "h200-0": (REPO / "tests/fixtures/vllm-0.22.0-h200-trained/metrics-rendered.prom").read_text(),
    "h100-nospec-0": (SHARED_FIXTURES / "vllm-0.22.0-h100/metrics-nospec-eager.prom").read_text(),
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    paths = find_monitoring(build=True)
    work = tmp_path_factory.mktemp("prom")
    servers, targets = [], []
    for pod, body in BODIES.items():
        server = MetricsServer("127.0.0.1", 0, lambda body=body: body)
        servers.append(server)
        port = server.server.server_address[1]
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NS, "pod": pod}})
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "engines", "static_configs": targets}],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))
    prom = PrometheusServer(paths.prometheus, work / "prometheus.yml", work).start()
    try:
        want = len(BODIES)
        wait_for(lambda: len(prom.query(timestamps_query([NS]))) == want, 60, 0.5, "Prometheus has scraped every engine")
        yield prom
    finally:
        prom.stop()
        for s in servers:
            s.close()


def _queries(prom: PrometheusServer) -> float:
    """Instant queries Prometheus has answered, from its own /metrics."""
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "prometheus_http_requests_total" and s.labels.get("handler") == "/api/v1/query"
    )


@pytest.mark.monitoring
@pytest.mark.timeout(300)
def test_snapshots_from_prometheus_equal_the_operators_own_scrape(prometheus):
    targets = [Target(EngineTarget.server(NS, "server"), pod, "unused") for pod in BODIES]
    targets.append(Target(EngineTarget.server(NS, "server"), "never-scraped-0", "unused"))

    async def go():
        source = PrometheusSource(prometheus.url, timeout=10, record_metrics=False)
        try:
            before = _queries(prometheus)
            t0 = time.time()
            # two servers' rounds at once (the supervisor runs one per server): one answer for both
            a, b = await asyncio.gather(source.scrape(targets[:2]), source.scrape(targets[2:]))
            return a + b, t0, before
        finally:
            await source.close()

    results, t0, before = asyncio.run(go())
    assert [r.target for r in results] == targets
    for r in results[: len(BODIES)]:
        assert r.ok, r.message
        want = parse_exposition(BODIES[r.target.pod], r.snapshot.timestamp)
        assert r.snapshot == want, r.target.pod
        assert t0 - 5 <= r.snapshot.timestamp <= t0 + 1  # Prometheus's scrape time, not the query's
    assert results[0].snapshot.spec_decode_enabled and results[0].snapshot.start_time is not None
    assert not results[2].snapshot.spec_decode_enabled and results[2].snapshot.generation_tokens is not None
    gone = results[-1]
    assert gone.error == ERROR_CONNECT and "no series for pod serving/never-scraped-0" in gone.message
    # one samples query and one timestamps query for both calls, counted by Prometheus itself
    assert _queries(prometheus) - before == 2


@pytest.mark.monitoring
@pytest.mark.timeout(300)
def test_prometheus_unreachable_is_a_connect_error_per_target(prometheus):
    dead = f"http://127.0.0.1:{_free_port()}"

    async def go():
        source = PrometheusSource(dead, timeout=5, record_metrics=False)
        try:
            return await source.scrape([Target(EngineTarget.server(NS, "server"), pod, "unused") for pod in BODIES])
        finally:
            await source.close()

    results = asyncio.run(go())
    assert [r.error for r in results] == [ERROR_CONNECT] * len(BODIES)
    assert all(dead in r.message for r in results)


@pytest.mark.monitoring
@pytest.mark.timeout(300)
def test_queries_are_valid_promql_for_the_real_server(prometheus):
    # the selector names every read family once, with or without the vllm prefix
    rows = prometheus.query(samples_query([NS, "other-ns"]))
    names = {r["metric"]["__name__"] for r in rows}
    assert "vllm:spec_decode_num_drafts_total" in names and "vllm:num_requests_waiting" in names
    assert not any(n.startswith(("vllm:time_to_first_token", "python_", "process_")) for n in names)


def test_setting_names_the_variable_and_the_fix():
    assert Settings.from_env({}).metrics_prometheus == ""
    s = Settings.from_env({"GDN_METRICS_PROMETHEUS": "http://prom.monitoring.svc:9090/"})
    assert s.metrics_prometheus == "http://prom.monitoring.svc:9090"
    with pytest.raises(SettingsError, match=r"GDN_METRICS_PROMETHEUS=.*http\(s\) URL"):
        Settings.from_env({"GDN_METRICS_PROMETHEUS": "prom:9090"})


def test_runtime_reads_from_prometheus_only_when_set():
    from gdn_operator.handlers.runtime import Runtime
    from gdn_operator.watch.scraper import Scraper

    direct = Runtime(Settings.from_env({}))
    via = Runtime(Settings.from_env({"GDN_METRICS_PROMETHEUS": "http://prom.monitoring.svc:9090"}))
    try:
        assert isinstance(direct.acceptance.scraper, Scraper)
        assert isinstance(via.acceptance.scraper, PrometheusSource)
        assert via.acceptance.scraper.url == "http://prom.monitoring.svc:9090/api/v1/query"
    finally:
        direct.log_pool.shutdown()
        via.log_pool.shutdown()
