"""Acceptance scraping on the real control plane: kwok gives engine pods loopback IPs; a stand-in engine
bound to that IP serves the REAL captured vLLM 0.32.0 exposition with its spec-decode counters advanced
by known amounts between scrapes, so the operator's figures in status and its exported gauges can be
checked against numbers computed independently here."""

from __future__ import annotations

import re
import threading
import uuid

import pytest

from metrics_standin import MetricsServer
from operator_harness import Kube, gms, running_operator, wait_for
from paths import CPU_CAPTURES

FIXTURE = CPU_CAPTURES / "metrics-mtp2.prom"

# Per scrape, the stand-in engine advances: drafts +10, draft tokens +20 (k=2), accepted +12 (pos0 +8, pos1 +4).
STEP = {"num_drafts": 10, "num_draft_tokens": 20, "num_accepted_tokens": 12}
STEP_POS = {"0": 8, "1": 4}


def exposition(step: int) -> str:
    text = FIXTURE.read_text()

    def bump(m: re.Match) -> str:
        metric, labels, value = m.group(1), m.group(2), float(m.group(3))
        base = metric.removeprefix("vllm:spec_decode_").removesuffix("_total")
        if base == "num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels).group(1)
            value += step * STEP_POS[pos]
        elif base in STEP:
            value += step * STEP[base]
        return f"{metric}{labels} {value}"

    return re.sub(r"^(vllm:spec_decode_\w+_total)(\{[^}]*\}) (\S+)$", bump, text, flags=re.M)


class StandIn:
    """Advances the counters by one STEP per scrape."""

    def __init__(self, ip: str, port: int = 8000):
        self.step = 0
        self.lock = threading.Lock()
        self.http = MetricsServer(ip, port, self._next)

    def _next(self) -> str:
        with self.lock:
            body = exposition(self.step)
            self.step += 1
        return body

    def close(self):
        self.http.close()


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    env = {"GDN_ACCEPTANCE_WINDOW": "60"}
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-accept"), env=env) as proc:
        yield proc


def test_acceptance_from_a_running_engine_reaches_status_and_gauges(op, kube_api):
    assert FIXTURE.exists(), f"missing captured exposition {FIXTURE}"
    k = Kube(kube_api)
    ns = k.create_namespace(f"a-{uuid.uuid4().hex[:8]}")
    k.create(ns, gms("acc", metrics={"scrapeIntervalSeconds": 5}))
    k.wait_condition(ns, "acc", "Ready", timeout=90)
    pod = k.engine_pods(ns, "acc")[0]
    ip = pod.status.pod_ip
    assert ip.startswith("127."), f"kwok pod IP {ip} is not loopback"
    engine = StandIn(ip)
    try:

        def measured():
            acc = k.status(ns, "acc").get("acceptance") or {}
            return acc if acc.get("state") == "Ok" else None

        acc = wait_for(measured, 60, interval=1, what="status.acceptance state Ok")
        # Independent arithmetic on the counters the stand-in served.
        assert acc["rate"] == pytest.approx(12 / 20, abs=1e-4)
        assert acc["meanAcceptedLength"] == pytest.approx(1 + 12 / 10, abs=1e-4)
        assert acc["perPosition"] == pytest.approx([8 / 10, 4 / 10], abs=1e-4)
        assert acc["rateDisplay"] == "60.0%"
        assert acc["podsReporting"] == 1
        assert acc["pods"][0]["pod"] == pod.metadata.name
        assert k.condition(ns, "acc", "MetricsAvailable")["status"] == "True"
        assert k.condition(ns, "acc", "AcceptanceHealthy")["status"] == "True"
        text = op.metrics()
        assert re.search(r'gdn_spec_acceptance_rate\{kind="GDNModelServer",namespace="%s",server="acc"\} 0\.6\b' % ns, text), (
            text[-2000:]
        )
        assert re.search(
            r'gdn_spec_acceptance_per_position\{kind="GDNModelServer",namespace="%s",position="1",server="acc"\} 0\.4\b' % ns,
            text,
        )
    finally:
        engine.close()

    # The engine stops answering: a condition, not an exception.
    cond = k.wait_condition(ns, "acc", "MetricsAvailable", "False", timeout=30)
    assert cond["reason"] == "ScrapeFailed" and "connect" in cond["message"]
    assert op.alive()
    k.delete_namespace(ns)
