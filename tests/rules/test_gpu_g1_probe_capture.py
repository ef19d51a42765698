"""The G1 probe on an H100 (tests/fixtures/vllm-0.22.0-h100-g1-probe, bench/probe_gpu_g1.py) against the cause the
rule and the gdn-guard guard fa3-group-metadata are built on (docs/upstream-fa3-group-metadata.md).

The capture shows, per variant, the attention metadata builders per KV-cache group, each FlashAttention builder's
FA3 scheduler_metadata buffer before and after batches of 1, 2 and 8 requests, and how many greedy answers were
exact. These tests read it: the split the operator predicts from the tiny model's config.json is the split vLLM
made; under FULL graphs the second group's buffer never moves and every row but the first is wrong; every variant
that stops the reuse or the FA3 FULL-graph buffer is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdn_operator.rules.layout import attention_groups, layout_from_config
from gdn_operator.versions import require_version

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "vllm-0.22.0-h100-g1-probe"
TINY = REPO / "tests" / "models" / "tiny-qwen3-next-recall"
VARIANTS = ("base", "patched", "fa2", "triton", "piecewise")
STAGES = ("builders@start", "builders@1", "builders@2", "builders@8")
FLASH, GDN = "FlashAttentionMetadataBuilder", "GDNAttentionMetadataBuilder"


def _load(variant: str) -> dict:
    return json.loads((FIX / f"g1-{variant}.json").read_text())


def _flash(stage: list[dict]) -> dict[int, dict]:
    return {b["gid"]: b for b in stage if b["builder"] == FLASH}


def _exact(r: dict, n: int) -> tuple[int, int]:
    ok, total = r[f"exact@{n}"].split("/")
    return int(ok), int(total)


def test_capture_is_complete_and_names_its_setup():
    for v in VARIANTS:
        r = _load(v)
        assert r["variant"] == v and r["tp"] == 1
        assert all(s in r for s in STAGES) and all(f"detail@{n}" in r for n in (1, 2, 8))
        log = (FIX / f"g1-{v}.log").read_text()
        assert "0.22.0" in log and "H100" in (FIX / "README.md").read_text()
        # the MTP layer tips the attention layers into two groups of one spec: vLLM pads the second
        assert log.count("Add 1 padding layers") == 1, v


def test_the_split_the_operator_predicts_is_the_split_vllm_made():
    """rules/layout.py on the tiny model's config.json: 2 + 1 MTP attention vs 2 GDN layers -> 2 attention groups,
    1 GDN group; without MTP one attention group. The probe's builders show the same groups."""
    lay = layout_from_config(json.loads((TINY / "config.json").read_text()), "config.json")
    assert lay is not None
    v = require_version("0.22.0")
    assert attention_groups(lay, mtp=True, version=v) == 2
    assert attention_groups(lay, mtp=False, version=v) == 1
    start = _load("base")["builders@start"]
    flash = _flash(start)
    assert len(flash) == 2 and len({b["gid"] for b in start if b["builder"] == GDN}) == 1
    layers = sorted(tuple(b["layers"]) for b in flash.values())
    assert layers == [
        ("model.layers.1.self_attn.attn", "mtp.layers.0.self_attn.attn"),
        ("model.layers.3.self_attn.attn",),
    ]


def test_base_second_group_buffer_is_frozen_and_rows_after_the_first_are_wrong():
    r = _load("base")
    gids = sorted(_flash(r["builders@start"]))
    first, second = gids
    assert all(b["reuse"] for b in _flash(r["builders@start"]).values())  # vLLM as shipped: reuse on
    frozen = [_flash(r[s])[second]["sched"] for s in STAGES]
    assert frozen[0] is not None and all(x == frozen[0] for x in frozen)  # never rewritten after capture
    moving = [_flash(r[s])[first]["sched"] for s in STAGES]
    assert len({json.dumps(x) for x in moving}) == len(STAGES)  # the first group's buffer changes every batch
    assert [_exact(r, n) for n in (1, 2, 8)] == [(1, 1), (1, 2), (1, 8)]
    for n in (2, 8):
        rows = r[f"detail@{n}"]
        assert rows[0]["prefix_ok"] == 64  # row 0 reads a schedule that fits it
        assert all(x["prefix_ok"] < 64 for x in rows[1:])  # every other row goes wrong


def test_the_guard_state_rewrites_every_group_and_is_exact():
    """`patched` is the state the guard puts builders in (reuse off when FULL graphs are on)."""
    r = _load("patched")
    assert all(not b["reuse"] for s in STAGES for b in _flash(r[s]).values())
    second = max(_flash(r["builders@start"]))
    bufs = [_flash(r[s])[second]["sched"] for s in STAGES]
    assert len({json.dumps(x) for x in bufs}) == len(STAGES)  # rewritten every batch
    for s in STAGES[1:]:
        f = _flash(r[s])
        assert f[min(f)]["sched"] == f[second]["sched"]  # the same schedule in both groups, each in its own buffer
    assert [_exact(r, n) for n in (1, 2, 8)] == [(1, 1), (2, 2), (8, 8)]


@pytest.mark.parametrize("variant", ["fa2", "piecewise"])
def test_no_fa3_full_graph_buffer_no_corruption(variant):
    r = _load(variant)
    assert len(_flash(r["builders@start"])) == 2  # the same two groups
    assert all(b["sched"] is None for s in STAGES for b in _flash(r[s]).values())
    assert [_exact(r, n) for n in (1, 2, 8)] == [(1, 1), (2, 2), (8, 8)]


def test_triton_leaves_the_mtp_layer_on_one_fa3_builder_in_one_group():
    """TRITON_ATTN does not reach the drafter: its FA3 builder stays, but in one group only, so nothing is shared."""
    r = _load("triton")
    flash = _flash(r["builders@start"])
    assert list(flash) == [1] and flash[1]["layers"] == ["mtp.layers.0.self_attn.attn"] and flash[1]["reuse"]
    triton = [b for b in r["builders@start"] if b["builder"] == "TritonAttentionMetadataBuilder"]
    assert sorted(g for b in triton for g in b["layers"]) == ["model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"]
    assert [_exact(r, n) for n in (1, 2, 8)] == [(1, 1), (2, 2), (8, 8)]
