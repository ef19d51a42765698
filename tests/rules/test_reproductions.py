"""The rules' `reproductions` (rules/data/rules.yaml): every figure their texts quote is recomputed here from the
committed GPU capture it names, so a text cannot drift from its evidence (issues 33, 34).

Captures: tests/fixtures/vllm-0.26.0-h200x2-prefix-caching (bench/bench_gpu_release.py, prefix caching by flag,
vllm#43559 / vllm#51571 / vllm#51508), tests/fixtures/vllm-0.26.0-h200-g1-guard-tp1 and
tests/fixtures/vllm-0.26.0-h200x2-g1-tp2-warmup (bench/bench_gpu_g1_guard.py, G1 and the gdn-guard guard).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from rules_helpers import mk

from gdn_operator.rules import evaluate, load_rules

REPO = Path(__file__).resolve().parents[2]
PC = REPO / "tests/fixtures/vllm-0.26.0-h200x2-prefix-caching"
G1 = "gdn-operator/mtp-full-decode-cudagraph"


def _bench():
    """bench/bench_gpu_release.py's own summary functions (agreement, spread), loaded without running it."""
    for d in ("bench", "tests/gpu"):
        sys.path.insert(0, str(REPO / d))
    spec = importlib.util.spec_from_file_location("bench_gpu_release", REPO / "bench/bench_gpu_release.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()


def _run(name: str) -> dict:
    return json.loads((PC / name).read_text())


def _rule(rid: str):
    return next(r for r in load_rules().rules if r.id == rid)


def _text(rid: str, fixture: str) -> str:
    r = next(x for x in _rule(rid).reproductions if x.fixture.endswith(fixture))
    return " ".join((r.result + " " + (r.default_cost or "")).split())


def _exact(run: dict, engine: str, work: str = "c8") -> tuple[int, int]:
    reps = run["cells"][engine][work]["reps"]
    return sum(r["exact"] for r in reps), sum(r["checked"] for r in reps)


def _ratio(run: dict, num: str, den: str, work: str) -> tuple[float, bool]:
    """median/median of the cell's repetitions (recomputed), and whether the spreads are apart."""
    x = BENCH.spread(run["cells"][num][work]["reps"])
    y = BENCH.spread(run["cells"][den][work]["reps"])
    return round(x["median"] / y["median"], 3), x["min"] > y["max"] or x["max"] < y["min"]


def test_every_reproduction_names_a_committed_capture():
    reps = [(r.id, x) for r in load_rules().rules for x in r.reproductions]
    assert {rid for rid, _ in reps} >= {"vllm#43559", "vllm#51571", "vllm#51508", G1}
    for rid, x in reps:
        assert (REPO / x.fixture).is_file(), (rid, x.fixture)


def test_summaries_in_the_captures_are_their_raw_repetitions():
    """release-1.json's prefix_agreement and ratios are what its per-request outputs and repetitions give."""
    run = _run("release-1.json")
    assert BENCH.agreement(run["cells"]) == run["prefix_agreement"]
    for key, r in run["ratios"].items():
        work, pair = key.split(" ")
        num, den = pair.split("/")
        assert _ratio(run, num, den, work) == (r["ratio"], r["claimed"]), key


def test_prefix_caching_with_mtp_not_reproduced_at_0_26_0():
    """vllm#43559: prefix caching on (p, p3) moves MTP's answers no more than it moves answers without MTP."""
    run = _run("release-1.json")
    agree = run["prefix_agreement"]
    facts = {e: run["engines"][e]["argv"] for e in ("a", "p", "p3", "q", "f")}
    assert "--enable-prefix-caching" in facts["p"] and "--no-async-scheduling" in facts["p"]
    assert "--enable-prefix-caching" not in facts["a"]
    log = (PC / "serve-p.log").read_text()
    assert "enable_prefix_caching=True" in log and "Asynchronous scheduling is disabled" in log
    block = int(re.search(r"Setting attention block size to (\d+) tokens", log).group(1))
    cache = run["cells"]["p"]["prefix"]["prefix_cache"]
    requests = sum(r["requests"] for r in run["cells"]["p"]["prefix"]["reps"])
    # with MTP each continuation hits exactly one block of the two its 1,225-token prompt fills
    assert cache["hits"] / requests == block == 560
    assert cache["hit_rate"] < run["cells"]["q"]["prefix"]["prefix_cache"]["hit_rate"]
    assert agree["p"]["agree_rate"] >= agree["q"]["agree_rate"] - 0.005 and agree["p3"]["agree_rate"] >= 0.99
    assert _exact(run, "p") == _exact(run, "a") == _exact(run, "f")
    pa, pa_apart = _ratio(run, "p", "a", "prefix")
    qf, qf_apart = _ratio(run, "q", "f", "prefix")
    text = _text("vllm#43559", "release-1.json")
    assert _rule("vllm#43559").reproductions[0].reproduced is False
    for fig in (
        agree["p"]["agree_rate"],
        agree["p"]["self_agree_rate"],
        agree["p3"]["agree_rate"],
        agree["q"]["agree_rate"],
        cache["hit_rate"],
        run["cells"]["q"]["prefix"]["prefix_cache"]["hit_rate"],
        f"{pa}x",
        f"{qf}x",
        f"{block}-token",
        "%d/%d" % _exact(run, "p"),
    ):
        assert str(fig) in text, fig
    assert pa_apart and "spreads apart" in text and not qf_apart and "spreads overlap" in text


def test_async_with_prefix_caching_and_mtp_reproduced_at_0_26_0():
    """vllm#51571: r (MTP + prefix caching + async, V1 runner) answers wrong where p (async off) does not."""
    one, two, three = _run("release-1.json"), _run("release-2.json"), _run("release-3.json")
    for run in (one, three):
        assert "--no-async-scheduling" not in run["engines"]["r"]["argv"]
        assert "--enable-prefix-caching" in run["engines"]["r"]["argv"]
        assert run["engines"]["r"]["env"].get("VLLM_USE_V2_MODEL_RUNNER") != "1"
    r_reps = [x["exact"] for x in three["cells"]["r"]["c8"]["reps"]]
    p_reps = [x["exact"] for x in three["cells"]["p"]["c8"]["reps"]]
    assert max(r_reps) < min(p_reps), (r_reps, p_reps)  # every repetition, same run
    assert _exact(one, "r")[0] < _exact(one, "p")[0]
    agree = one["prefix_agreement"]["r"]
    assert agree["agree_rate"] < 0.95 and agree["self_agree_rate"] < 0.9
    assert _exact(two, "g") == _exact(two, "e")  # async on without prefix caching: as exact as async off
    rp, rp_apart = _ratio(three, "r", "p", "c8")
    text = _text("vllm#51571", "release-3.json")
    assert _rule("vllm#51571").reproductions[0].reproduced is True
    for fig in (
        "%d/%d" % _exact(three, "r"),
        " / ".join(str(x) for x in r_reps),
        "%d/%d" % _exact(three, "p"),
        "%d/%d" % _exact(one, "r"),
        "%d/%d" % _exact(one, "p"),
        agree["agree_rate"],
        agree["self_agree_rate"],
        "%d/%d" % _exact(two, "g"),
        f"{rp}x",
    ):
        assert str(fig) in text, fig
    assert not rp_apart and "spreads overlap" in text


def test_async_alone_not_reproduced_at_0_26_0():
    """vllm#51508's trigger (GDN + MTP + async) without prefix caching: g as exact as e, and slower."""
    two = _run("release-2.json")
    assert "--no-async-scheduling" not in two["engines"]["g"]["argv"]
    assert "--no-async-scheduling" in two["engines"]["e"]["argv"]
    ge, apart = _ratio(two, "g", "e", "c8")
    text = _text("vllm#51508", "release-2.json")
    assert _rule("vllm#51508").reproductions[0].reproduced is False
    for fig in ("%d/%d" % _exact(two, "g"), f"{ge}x"):
        assert str(fig) in text, fig
    assert apart and "spreads apart" in text


def test_g1_guard_served_figures():
    tp1 = json.loads((REPO / "tests/fixtures/vllm-0.26.0-h200-g1-guard-tp1/g1-guard.json").read_text())
    s = tp1["summary"]
    text = _text(G1, "vllm-0.26.0-h200-g1-guard-tp1/g1-guard.json")
    for fig in (
        f"{s['base']['c=8']['exact']}/{s['base']['c=8']['requests']}",
        f"{s['base']['c=32']['exact']}/{s['base']['c=32']['requests']}",
        f"{s['guard']['c=8']['exact']}/{s['guard']['c=8']['requests']}",
        f"{s['piecewise']['c=32']['exact']}/{s['piecewise']['c=32']['requests']}",
        " / ".join(str(round(x)) for x in s["guard"]["c=32"]["tokens_per_s"]),
        " / ".join(str(round(x)) for x in s["piecewise"]["c=32"]["tokens_per_s"]),
        f"{max(s['guard']['c=32']['tokens_per_s']) / max(s['piecewise']['c=32']['tokens_per_s']):.2f}x",
        f"applied in {tp1['engines']['guard']['log']['processes_with_guard']} processes",
    ):
        assert str(fig) in text, fig


def test_g1_tp2_stall_and_guard():
    """TP=2: vLLM's FULL graphs stalled with /health 200; the guarded engine answered its warm-up exactly."""
    tp2 = json.loads((REPO / "tests/fixtures/vllm-0.26.0-h200x2-g1-tp2-warmup/g1-guard.json").read_text())
    assert tp2["tp"] == 2 and tp2["gpus"] == "0,1"
    base = next(p for p in tp2["passes"] if p["variant"] == "base")
    assert base["stalled"] and base["health_after"] == 200 and base["engine_alive"] and base["exact"] == 0
    e = tp2["engines"]
    assert e["base"]["warmup"]["errors"] == e["base"]["warmup"]["requests"] == 8
    assert e["guard"]["warmup"]["exact"] == e["guard"]["warmup"]["requests"] == 8
    assert e["piecewise"]["warmup"]["exact"] == 8
    assert e["guard"]["log"]["processes_with_guard"] >= 1 + tp2["tp"]
    assert e["guard"]["log"]["guard_decision_lines"] >= tp2["tp"]
    assert e["base"]["log"]["processes_with_guard"] == 0 and e["base"]["log"]["tracebacks"] == 0
    text = _text(G1, "vllm-0.26.0-h200x2-g1-tp2-warmup/g1-guard.json")
    assert f"{e['guard']['log']['processes_with_guard']} processes" in text
    assert f"in {e['guard']['warmup']['wall_s']:.1f} s" in text


@pytest.mark.parametrize("field", ["prefixCaching", "asyncScheduling"])
def test_status_cost_of_a_default_quotes_the_release_it_was_measured_at(field):
    """At 0.33.0 nothing measured the defaults: status.effective.defaults[].cost says so, then what 0.26.0 showed
    (named with its release, GPU, model and TP), and whether the defect reproduced there."""
    text = {d.field: d.cost for d in evaluate(mk("0.33.0")).effective.defaults}[field]
    assert text.startswith(
        "unmeasured at vLLM 0.33.0 for this configuration; at vLLM 0.26.0 (NVIDIA H200, prod-geometry, TP=1): "
    )
    rid = {"prefixCaching": "vllm#43559", "asyncScheduling": "vllm#51571"}[field]
    assert " ".join(_rule(rid).reproductions[0].default_cost.split()) in " ".join(text.split())
    assert f"{rid} {'reproduced' if rid == 'vllm#51571' else 'not reproduced'} there" in text


def _cell(*tps: float) -> dict:
    return {"tokens_per_s": BENCH.spread([{"tokens_per_s": t} for t in tps])}


def test_a_ratio_is_claimed_beyond_the_runs_own_a_a_pair_only():
    """bench_gpu_release's ratios: spreads apart is not enough where the A/A pair (a2/a) moved more than the ratio."""
    cells = {
        "a": {"c8": _cell(100, 101, 102)},
        "a2": {"c8": _cell(110, 111, 112)},  # the same configuration, 1.09x on the other GPU
        "b": {"c8": _cell(93, 94, 95)},  # a/b 1.074: spreads apart, inside the floor
        "p": {"c8": _cell(70, 71, 72)},  # p/a 0.70: apart and beyond
    }
    r = BENCH.ratios(cells)
    assert r["c8 a/b"]["claimed"] and not r["c8 a/b"]["beyond_noise"]
    assert r["c8 a/b"]["noise_floor"] == round(111 / 101 - 1, 3)
    assert r["c8 p/a"]["claimed"] and r["c8 p/a"]["beyond_noise"]
    cells.pop("a2")
    assert "beyond_noise" not in BENCH.ratios(cells)["c8 a/b"]  # no A/A pair in the run: no floor claimed
