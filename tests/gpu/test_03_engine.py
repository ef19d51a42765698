"""(a) the rendered engine serves and exposes vllm:spec_decode_*, and our acceptance code reads the real
/metrics exactly; (d) gdn-guard loads in the API server and the engine core and its line passes the
operator's patch-set check; (e) exact greedy answers of the trained tiny model with MTP on and off,
async and sync scheduling."""

from __future__ import annotations

import re

import pytest

import harness
from harness import CONFIGS, GUARDED, ready
from waiting import poll

from gdn_operator.watch.acceptance import PodWindow, parse_exposition
from gdn_operator.watch.guardline import check_patch_set, parse_guard_line

SPEC_SERIES = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
)


def _raw(body: str, series: str) -> dict[str, float]:
    """Independent reading of one counter: label-set → value (no project code)."""
    out = {}
    for m in re.finditer(rf"^{re.escape(series)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", body, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def _items(n_short: int = 24, n_long: int = 8) -> list[dict]:
    items = harness.heldout()
    short = [i for i in items if len(i["expected"]) <= 40][:n_short]
    long = [i for i in items if len(i["expected"]) > 40][:n_long]
    return short + long


def test_rendered_engine_serves_and_acceptance_equals_raw_counters(engines, artifacts, results):
    eng = ready(engines, "rendered")
    argv = eng.argv
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":2}'
    assert "--no-async-scheduling" in argv, "the vllm#45100 mitigation must be in the rendered argv at 0.22.0"
    assert any("mitigated vllm#45100" in n for n in eng.extra["rendered"].notes)
    before = harness.metrics(eng)
    items = _items()
    got, wall = harness.run_requests(eng, items, concurrency=8)
    # The API server records an engine step's stats as it handles the step's outputs, which may be just
    # after the last response went out: wait until the generated tokens of all responses are counted.
    want = sum(_raw(before, "vllm:generation_tokens_total").values()) + sum(g["completion_tokens"] for g in got)
    after, _ = poll(
        lambda: harness.metrics(eng),
        timeout=15,
        interval=0.2,
        until=lambda text: sum(_raw(text, "vllm:generation_tokens_total").values()) >= want,
    )
    (artifacts / "metrics-rendered.prom").write_text(after)
    for s in SPEC_SERIES:
        assert s in after, f"{s} missing from /metrics"
    w = PodWindow(window=3600)
    w.observe(parse_exposition(before, timestamp=1.0))
    w.observe(parse_exposition(after, timestamp=1.0 + wall))
    st = w.stats()
    d = {s: sum(_raw(after, s).values()) - sum(_raw(before, s).values()) for s in SPEC_SERIES}
    drafts, draft_tokens, accepted, _ = (d[s] for s in SPEC_SERIES)
    assert drafts > 0 and draft_tokens == 2 * drafts
    assert (st.drafts, st.draft_tokens, st.accepted) == (drafts, draft_tokens, accepted)
    pos_before, pos_after = (_raw(b, SPEC_SERIES[3]) for b in (before, after))
    per_pos = [
        pos_after[k] - pos_before.get(k, 0.0) for k in sorted(pos_after, key=lambda k: re.search(r'position="(\d+)"', k).group(1))
    ]
    assert list(st.accepted_per_position) == per_pos and sum(per_pos) == accepted
    assert st.acceptance_rate == pytest.approx(accepted / draft_tokens, abs=0, rel=1e-12)
    assert st.mean_accepted_length == pytest.approx(1 + accepted / drafts, abs=0, rel=1e-12)
    gen = sum(_raw(after, "vllm:generation_tokens_total").values()) - sum(_raw(before, "vllm:generation_tokens_total").values())
    assert st.generation_tokens == gen == sum(g["completion_tokens"] for g in got)
    # The trained head copies the prompt: a working MTP head has real acceptance (dummy weights give 0).
    assert accepted > 0.5 * draft_tokens, f"acceptance {accepted}/{draft_tokens}: is the MTP head trained?"
    results["acceptance_rendered"] = {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted": accepted,
        "per_position": per_pos,
        "acceptance_rate": st.acceptance_rate,
        "mean_accepted_length": st.mean_accepted_length,
    }


def test_gdn_guard_loads_in_api_server_and_engine_core(engines):
    eng = ready(engines, GUARDED)
    lines = [ln for ln in eng.log_text().splitlines() if "gdn-guard" in ln and "active guards" in ln]
    core = [ln for ln in lines if "EngineCore" in ln]
    api = [ln for ln in lines if "EngineCore" not in ln]
    assert core and api, f"expected the start-up line from both processes, got {lines}"
    for ln in (api[0], core[0]):
        parsed = parse_guard_line(ln)
        assert parsed is not None and parsed.vllm_version == harness.VLLM_VERSION
        check = check_patch_set([], parsed, harness.VLLM_VERSION)
        assert check.ok, check.message
    # The unguarded engines are ready too (positive evidence first), and their logs have no such line.
    other = ready(engines, "nomtp-async")
    assert "gdn-guard" not in other.log_text()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_greedy_answers(engines, artifacts, results, name):
    eng = ready(engines, name)
    # Async + MTP at 0.22.0 carries vllm#45100 (B2) under concurrent requests finishing at different
    # times: that is reproduced by bench/bench_gpu_mtp.py --mode b2; here it serves one request at a time.
    conc = 1 if name == "mtp-async" else 8
    items = _items()
    got, wall = harness.run_requests(eng, items, concurrency=conc)
    eos = harness.eos_ids()
    verdicts = [harness.judge(i, g, eos) for i, g in zip(items, got)]
    results.setdefault("answers", {})[name] = {
        "argv": eng.argv,
        "ready_s": round(eng.ready_s, 1),
        "concurrency": conc,
        "wall_s": round(wall, 2),
        "exact": verdicts.count("exact"),
        "short": verdicts.count("short"),
        "wrong": verdicts.count("wrong"),
        "tokens": sum(g["completion_tokens"] for g in got),
    }
    if name == "nomtp-async":
        (artifacts / "metrics-nomtp-async.prom").write_text(harness.metrics(eng))
    bad = [(i["id"], i["expected"], g) for i, g, v in zip(items, got, verdicts) if v != "exact"]
    assert not bad, f"{name}: {len(bad)}/{len(items)} answers not exact; first: {bad[:3]}"
