"""PR #45100 (B2, rule vllm#45100) on two H100s at TP=2 (tests/fixtures/vllm-0.22.0-h100x2-tp2, eager part):
MTP k=2 with async scheduling on gives wrong recall answers; the operator's rendered configuration (async
off) and MTP off give none. At TP=1 it was not reproduced (test_gpu_trained_captures). The figures are read
from the bench's JSON and checked against the engine logs and the argv each engine ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdn_operator.watch.signatures import classify_text

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.22.0-h100x2-tp2"


@pytest.fixture(scope="module")
def bench() -> dict:
    return json.loads((CAPTURE / "bench-gpu-tp-eager.json").read_text())


def _by_config(bench: dict) -> dict:
    return {r["config"]: r for r in bench["results"]}


def test_capture_is_tp2_on_two_h100s(bench):
    assert bench["tp"] == 2 and bench["vllm_version"] == "0.22.0"
    assert len(bench["gpus"]) == 2 and all("H100" in g for g in bench["gpus"])


def test_b2_reproduced_with_async_scheduling_at_tp2(bench):
    r = _by_config(bench)["async-on"]
    assert "--async-scheduling" in r["argv"] and "--tensor-parallel-size" in r["argv"]
    assert r["argv"][r["argv"].index("--tensor-parallel-size") + 1] == "2"
    ld = r["load"]
    assert not ld["crashed"] and ld["failed"] == 0
    wrong = ld["recall"] - ld["recall_exact"]
    assert (ld["recall_exact"], ld["recall"]) == (136, 140) and wrong == 4
    # garbled mid-answer: a correct prefix, then wrong symbols until the length limit
    for bad in ld["bad_recall_sample"]:
        assert bad["verdict"] == "wrong" and bad["finish"] == "length"
        common = next((i for i, (a, b) in enumerate(zip(bad["expected"], bad["got"])) if a != b), None)
        assert common is not None and common >= 10


def test_operators_mitigation_and_controls_are_exact(bench):
    by = _by_config(bench)
    base = by["base"]
    assert "--no-async-scheduling" in base["argv"] and base["changed_after_render"] == []  # as rendered
    for cfg in ("base", "nomtp-async-on", "async-on-p2p-off"):
        ld = by[cfg]["load"]
        assert ld["recall"] >= 100 and ld["recall_exact"] == ld["recall"], cfg
        assert not ld["crashed"] and ld["failed"] == 0
    assert "--speculative-config" not in by["nomtp-async-on"]["argv"]


def test_no_engine_crashed_and_logs_match_the_configs(bench):
    for cfg in _by_config(bench):
        text = (CAPTURE / f"eager-serve-{cfg}.log").read_text()
        assert not classify_text(text).crashed, cfg
        assert "illegal memory access" not in text  # vllm#41190 did not appear
        first = text.splitlines()[0]
        assert ("--async-scheduling" in first) == (cfg != "base"), cfg
