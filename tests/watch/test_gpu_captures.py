"""The operator's readers on real vLLM 0.22.0 H100 captures (tests/fixtures/vllm-0.22.0-h100, README there):
the /metrics exposition, the crash classifier, and the gdn-guard start-up line / patch-set check.
GPU runs (hack/gpu-test.sh) add their captures to the same directory; CI keeps checking what the GPU showed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gdn_operator.watch.acceptance import (
    REASON_NEAR_ZERO,
    detect_near_zero_acceptance,
    parse_exposition,
    window_since_start,
)
from gdn_operator.watch.guardline import check_patch_set, parse_guard_line
from gdn_operator.watch.signatures import classify_text

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.22.0-h100"


def _raw_sum(body: str, series: str) -> float:
    """Independent reading of a counter (sum over label sets), no project code."""
    vals = re.findall(rf"^{re.escape(series)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", body, re.M)
    assert vals, f"{series} not in the capture"
    return sum(float(v) for v in vals)


def _per_position(body: str) -> list[float]:
    rows = re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} ([0-9.eE+-]+)$', body, re.M
    )
    return [float(v) for _, v in sorted(rows, key=lambda r: int(r[0]))]


def test_mtp_exposition_figures_equal_raw_counters():
    body = (CAPTURES / "metrics-mtp2-eager.prom").read_text()
    snap = parse_exposition(body, timestamp=100.0)
    assert snap.spec_decode_enabled and snap.engines == 1
    raw = {k: _raw_sum(body, f"vllm:spec_decode_num_{k}_total") for k in ("drafts", "draft_tokens", "accepted_tokens")}
    assert (snap.num_drafts, snap.num_draft_tokens, snap.num_accepted_tokens) == (
        raw["drafts"],
        raw["draft_tokens"],
        raw["accepted_tokens"],
    )
    assert list(snap.accepted_per_position) == _per_position(body)
    assert snap.generation_tokens == _raw_sum(body, "vllm:generation_tokens_total")
    # The window from an engine that had served nothing to this scrape: figures are the raw counters.
    w = window_since_start(snap)
    st = w.stats()
    assert (st.drafts, st.draft_tokens, st.accepted) == (raw["drafts"], raw["draft_tokens"], raw["accepted_tokens"])
    assert st.acceptance_rate == raw["accepted_tokens"] / raw["draft_tokens"]
    assert st.mean_accepted_length == 1.0 + raw["accepted_tokens"] / raw["drafts"]


def test_dummy_weight_mtp_capture_is_flagged_near_zero_acceptance():
    # Dummy weights: the MTP head guesses at random, 0 of 6540 draft tokens accepted on the H100.
    body = (CAPTURES / "metrics-mtp2-eager.prom").read_text()
    snap = parse_exposition(body, timestamp=100.0)
    w = window_since_start(snap)
    f = detect_near_zero_acceptance(w.stats())
    assert f is not None and f.reason == REASON_NEAR_ZERO


def test_spec_off_exposition_has_no_spec_decode_figures():
    body = (CAPTURES / "metrics-nospec-eager.prom").read_text()
    snap = parse_exposition(body, timestamp=1.0)
    assert "vllm:spec_decode_num_drafts_total" not in body
    assert not snap.spec_decode_enabled and snap.num_drafts is None
    assert snap.generation_tokens == _raw_sum(body, "vllm:generation_tokens_total") > 0


def test_v2_runner_refusal_on_h100_is_classified_as_vllm_38041():
    r = classify_text((CAPTURES / "serve-v2-runner-mtp2.log").read_text())
    assert r.crashed and r.upstream == "vllm#38041"
    assert "VLLM_USE_V2_MODEL_RUNNER does not yet support" in (r.root_cause or "") + " ".join(m.text for m in r.matched)


def test_missing_flashinfer_crash_names_the_module_as_root_cause():
    r = classify_text((CAPTURES / "serve-no-flashinfer-workarounds-mtp2-eager.log").read_text())
    assert r.crashed
    assert "No module named 'flashinfer'" in (r.root_cause or "")


@pytest.mark.parametrize("process", ["api-server", "engine-core"])
def test_gdn_guard_line_from_each_process_passes_the_patch_set_check(process):
    lines = [ln for ln in (CAPTURES / "serve-gdn-guard-mtp2.log").read_text().splitlines() if "gdn-guard 0" in ln]
    pick = [ln for ln in lines if ("EngineCore" in ln) == (process == "engine-core")]
    assert len(pick) == 1, lines
    g = parse_guard_line(pick[0])
    assert g is not None and g.vllm_version == "0.22.0" and g.guards == () and g.patch_ids == ()
    assert check_patch_set([], g, "0.22.0").ok
    # An image that declared the PR #45100 backport while its plugin applied nothing is caught.
    bad = check_patch_set(["gdn-guard/vllm-45100"], g, "0.22.0")
    assert not bad.ok and bad.reason == "PatchSetMismatch"
    # ... and so is a spec that names another vLLM version than the engine runs.
    assert check_patch_set([], g, "0.23.0").reason == "VersionMismatch"
