"""handlers/acceptance.AcceptanceSupervisor.scrape_round: what a round writes to status.

A server with no engine pod and nothing about acceptance in its status yet gets no status write (a "NoData"
block would be one more write per new server in a burst); once figures or conditions are in status, a round
with no pods still writes (the figures must not stay stale), and a server whose pods appear is written."""

from __future__ import annotations

from typing import Any

import pytest

from gdn_operator.handlers.engines import acceptance as acc
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.watch.acceptance import AcceptanceTracker


class _Scraper:
    async def scrape(self, targets: list[Any]) -> list[Any]:
        return []

    async def close(self) -> None:
        pass


def _body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "srv", "uid": "u1", "generation": 1, "resourceVersion": "5"},
        "spec": {},
        "status": {"observedGeneration": 1, **(status or {})},
    }


@pytest.fixture
def writes(monkeypatch):
    calls: list[tuple[str, str, int]] = []

    def write(namespace, name, acceptance, targets, failed, stall=None, bodies=None):
        calls.append((namespace, name, targets))
        return [], None

    monkeypatch.setattr(acc, "write_acceptance", write)
    return calls


def _sup(body: dict[str, Any] | None) -> acc.AcceptanceSupervisor:
    bodies = Servers()
    if body is not None:
        bodies.put(body)
    return acc.AcceptanceSupervisor(AcceptanceTracker(window=60), _Scraper(), concurrency=1, bodies=bodies)


async def test_a_new_server_without_pods_costs_no_status_write(writes):
    sup = _sup(_body())
    for _ in range(3):
        await sup.scrape_round("ns", "srv", [])
    assert writes == []


@pytest.mark.parametrize(
    "status",
    [
        {"acceptance": {"state": "Ok", "rate": 0.6}},
        {"conditions": [{"type": "MetricsAvailable", "status": "True", "reason": "Scraped"}]},
        {"conditions": [{"type": "AcceptanceHealthy", "status": "False", "reason": "SpecAcceptanceNearZero"}]},
    ],
)
async def test_figures_or_conditions_in_status_are_corrected_when_the_pods_are_gone(writes, status):
    sup = _sup(_body(status))
    await sup.scrape_round("ns", "srv", [])
    await sup.scrape_round("ns", "srv", [])  # unchanged figures are not written twice
    assert writes == [("ns", "srv", 0)]


async def test_an_unknown_body_is_written_as_before(writes):
    sup = _sup(None)
    await sup.scrape_round("ns", "srv", [])
    assert writes == [("ns", "srv", 0)]


async def test_a_server_whose_pod_appears_is_written(writes):
    sup = _sup(_body())
    await sup.scrape_round("ns", "srv", [])
    assert writes == []
    await sup.scrape_round("ns", "srv", [{"name": "srv-0", "ip": "127.0.0.9", "ready": True}])
    assert writes == [("ns", "srv", 1)]
