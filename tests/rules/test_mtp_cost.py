"""What the rules' mitigations measurably cost (issue 25 item 3): rules.yaml `cost`, rules/cost.py, MTPSlowerThanOff.

1. The data cannot drift from the evidence: every `cost` entry's ratios are recomputed from its GPU capture
   (tests/fixtures/vllm-0.22.0-h100x2-prodmodel: production geometry; ../shared/fixtures/
   vllm-0.22.0-h100-mtp-graphs: the tiny model), every measured concurrency is in the data, and the engines
   the fixture names ran what the entry says (release, MTP k, the mitigation, async, TP; MTP off without a
   speculative config; the unmitigated engine without the mitigation).
2. The rule loader refuses a malformed entry with a clear error.
3. The advisory: G1's PIECEWISE at 0.22.0 (defaulted, set, mitigated, an operator override) → MTPSlowerThanOff
   with 0.843 at concurrency 32 (prod geometry); maxNumSeqs below 32 → MTPSlowerOnlyAboveMaxNumSeqs; a
   release, TP or mode no entry measured, or MTP off → nothing; never a warning, never a change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import REPO, SHARED
from rules_helpers import UNKNOWN_LAYOUT_MODEL, mk

from gdn_operator.api.overrides import apply_overrides
from gdn_operator.api.status import GDNModelServerStatus
from gdn_operator.rules import effective_config, evaluate, evaluate_launch, load_rules
from gdn_operator.rules.cost import SLOWER, SLOWER_ABOVE_RANGE, cost_findings, default_cost
from gdn_operator.rules.rulefile import Cost, RuleFileError, default_rule_file, parse_rule_file

G1 = "gdn-operator/mtp-full-decode-cudagraph"
#: G1 enforces at 0.22.0 where the checkpoint's layout is unknown (a known one-group layout is not mitigated)
G1_MODEL = UNKNOWN_LAYOUT_MODEL
ENTRIES = [
    (r.id, i, c) for r in load_rules().costed for i, c in enumerate(r.cost) if c.basis == "measured"
]  # step-cost: test_stepcost_cost.py


def _path(p: str) -> Path:
    return SHARED / p[len("shared/") :] if p.startswith("shared/") else REPO / p


# ------------------------------------------------------------------ 1. the data is the evidence


#: the launch flag a mitigation adds (what the unmitigated engine lacks), per mitigation path
MITIGATION_FLAG = {"asyncScheduling": "--no-async-scheduling", "prefixCaching": "--no-enable-prefix-caching"}


def _engines(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> {argv, tps: {concurrency: tokens/s}, exact: {concurrency: exact fraction}} for the three capture
    formats (bench/bench_gpu_mtp_graphs.py's mtp-graphs.json; the tiny-model driver's mtpval.json;
    bench/bench_gpu_release.py's release.json: the median of each fixed-length cell's repetitions)."""
    out: dict[str, dict[str, Any]] = {}
    if "cells" in doc:
        for name, eng in doc["engines"].items():
            cells = {int(w[1:]): c for w, c in doc["cells"].get(name, {}).items() if re.fullmatch(r"c\d+", w)}
            out[name] = {
                "argv": eng["argv"],
                "tps": {c: m["tokens_per_s"]["median"] for c, m in cells.items()},
                "exact": {c: m["exact"][0] / m["exact"][1] for c, m in cells.items()},
                "log_facts": eng.get("log_facts", []),
            }
    elif "throughput" in doc:
        for name, eng in doc["engines"].items():
            levels = doc["throughput"].get(name, {})
            out[name] = {
                "argv": eng["argv"],
                "tps": {int(c): m["tokens_per_s"] for c, m in levels.items()},
                "exact": {int(c): m["exact"] / m["requests"] for c, m in levels.items()},
            }
    else:
        for name, cfg in doc["configs"].items():
            out[name] = {
                "argv": cfg["argv"],
                "tps": {r["concurrency"]: r["tokens_per_s"] for r in cfg["runs"]},
                "exact": {r["concurrency"]: r["exact"] / r["requests"] for r in cfg["runs"]},
            }
    return out


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _engine_version(fixture: Path, engine: str, facts: list[str] = ()) -> str:
    """The release the engine's log names (its kept log, else the start-up lines the driver kept in the JSON)."""
    path = fixture.parent / f"serve-{engine}.log"
    log = path.read_text(errors="replace") if path.exists() else "\n".join(facts)
    m = re.search(r"Initializing a V1 LLM engine \(v([^)]+)\)", log)
    assert m, f"{fixture.parent.name}/serve-{engine}.log names no vLLM version"
    return m.group(1)


def test_there_is_cost_data_for_g1_at_0_22_0():
    assert any(rid == G1 and c.vllm == "0.22.0" and c.representative for rid, _, c in ENTRIES)


@pytest.mark.parametrize("rid, i, cost", ENTRIES, ids=[f"{rid}[{i}]" for rid, i, _ in ENTRIES])
def test_cost_ratios_are_recomputed_from_the_fixture(rid: str, i: int, cost: Cost):
    fixture = _path(cost.fixture)
    assert fixture.is_file(), f"{rid} cost[{i}]: fixture {cost.fixture} missing"
    assert _path(cost.model_path).is_dir(), cost.model_path
    eng = _engines(json.loads(fixture.read_text()))
    names = cost.engines
    mit, off = eng[names.mitigated], eng[names.mtp_off]
    unmit = eng[names.unmitigated] if names.unmitigated else None
    # every concurrency the capture measured is in the data (no picking the favourable ones), and only those
    assert [p.concurrency for p in cost.points] == sorted(mit["tps"]) == sorted(off["tps"])
    for p in cost.points:
        c = p.concurrency
        assert abs(mit["tps"][c] / off["tps"][c] - p.vs_off) <= 0.0005 + 1e-9, (rid, i, c)
        if unmit is not None and c in unmit["tps"]:
            assert p.vs_unmitigated is not None and abs(mit["tps"][c] / unmit["tps"][c] - p.vs_unmitigated) <= 0.0005 + 1e-9
        else:  # a ratio to an engine not measured at that concurrency would be made up
            assert p.vs_unmitigated is None, (rid, i, c)
        # the mitigated MTP gave the answers MTP off gave: a cost of something that works (time-bound repetitions
        # send different request counts, so the exact fractions agree within one answer in a hundred)
        assert mit["exact"][c] == pytest.approx(off["exact"][c], abs=0.012), (rid, i, c)
    # the engines ran what the entry says
    for name in (names.mitigated, names.mtp_off, *([names.unmitigated] if names.unmitigated else [])):
        assert _engine_version(fixture, name, eng[name].get("log_facts", [])) == cost.vllm
    a = mit["argv"]
    spec_cfg = json.loads(_flag(a, "--speculative-config") or "{}")
    assert spec_cfg.get("method") == "mtp" and cost.config["mtp"] is True
    assert spec_cfg["num_speculative_tokens"] == cost.config["num_speculative_tokens"]
    mode = cost.config.get("cudagraph_mode", "auto")
    assert json.loads(_flag(a, "--compilation-config") or "{}").get("cudagraph_mode", "auto") == mode
    assert ("--no-async-scheduling" in a) == (cost.config["async_scheduling"] is False)
    assert int(_flag(a, "--tensor-parallel-size") or 1) == cost.config["tensor_parallel_size"]
    assert "--enforce-eager" not in a
    b = off["argv"]
    assert "--speculative-config" not in b and "--compilation-config" not in b and "--enforce-eager" not in b
    if unmit is not None:  # the same MTP without the mitigation (G1's: vLLM's default CUDA-graph mode)
        u = unmit["argv"]
        assert _flag(u, "--speculative-config") == _flag(a, "--speculative-config") and "--compilation-config" not in u
        rule = next(r for r in load_rules().costed if r.id == rid)
        flags = [MITIGATION_FLAG[p] for p in rule.mitigation or {} if p in MITIGATION_FLAG]
        if flags:  # a launch flag: exactly that flag is what the unmitigated engine lacks
            assert [x for x in a if x.startswith("--") and x not in u] == flags, (rid, i)


def test_cost_entries_hold_their_rules_mitigation():
    from gdn_operator.rules.effective import FIELDS

    for r in load_rules().costed:
        for c in r.cost:
            for path, value in (r.mitigation or {}).items():
                field = next(k for k, v in FIELDS.items() if v == f"spec.{path}")
                assert c.config[field] == value, (r.id, path)


def test_there_is_cost_data_for_the_async_default_at_0_26_0():
    """The default the 0.26.0 capture measured (issue 32): MTP as rendered (async off) against MTP off, and
    against MTP with async on; no loss at fixed-length recall, so no advisory."""
    entry = next(c for rid, _, c in ENTRIES if rid == "vllm#53962" and c.vllm == "0.26.0")
    assert [(p.concurrency, p.vs_off) for p in entry.points] == [(1, 1.219), (8, 1.058), (32, 1.152)]
    assert not [f for f in evaluate(mk("0.26.0")).advisories if f.code in (SLOWER, SLOWER_ABOVE_RANGE)]


# ------------------------------------------------------------------ 2. the loader


def _raw() -> dict[str, Any]:
    return yaml.safe_load(default_rule_file().read_text())


def _g1_cost(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return next(r for r in raw["rules"] if r["id"] == G1)["cost"]


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda c: c[0]["config"].update(cudagraph_mode="FULL"), r"cost\[0\]: config.cudagraph_mode must be"),
        (lambda c: c[0]["config"].update(cudagraph="PIECEWISE"), "unknown effective field"),
        (lambda c: c[0].update(vllm="0.22.x"), "not a version"),
        (lambda c: c[0].update(fixture="/data/run.json"), "must be a path in the checkout"),
        (lambda c: c[0].update(fixture="tests/../../x.json"), "must be a path in the checkout"),
        (lambda c: c[1].pop("why"), "needs `why`"),
        (lambda c: c[0]["points"].reverse(), "increasing order"),
        (lambda c: c[0]["engines"].pop("unmitigated"), "vs_unmitigated needs engines.unmitigated"),
        (lambda c: c[0]["points"][0].update(vs_off=0), "greater than 0"),
    ],
)
def test_malformed_cost_is_a_clear_error(mutate, expect):
    raw = _raw()
    mutate(_g1_cost(raw))
    with pytest.raises(RuleFileError) as ei:
        parse_rule_file(yaml.safe_dump(raw), "rules.yaml")
    text = "\n".join(ei.value.problems)
    assert G1 in text and re.search(expect, text), text


def test_a_cost_on_a_rule_without_mitigation_is_refused():
    raw = _raw()
    plain = next(r for r in raw["rules"] if not r.get("mitigation"))
    plain["cost"] = _g1_cost(raw)[:1]
    with pytest.raises(RuleFileError, match="the rule has no mitigation"):
        parse_rule_file(yaml.safe_dump(raw), "rules.yaml")


# ------------------------------------------------------------------ 3. the advisory


def _cost_advisories(ev) -> list:
    return [f for f in ev.advisories if f.code in (SLOWER, SLOWER_ABOVE_RANGE)]


def _one(ev):
    found = _cost_advisories(ev)
    assert len(found) == 1, [f.message for f in ev.findings]
    return found[0]


def test_default_piecewise_at_0_22_0_is_reported_slower_than_mtp_off_at_concurrency_32():
    ev = evaluate(mk("0.22.0", model=G1_MODEL))
    assert {(d.field, d.value, d.rule) for d in ev.defaults} >= {("cudagraphMode", "PIECEWISE", G1)}  # unchanged
    assert ev.allowed and not ev.changed and ev.exit_code == 0 and not ev.warnings
    f = _one(ev)
    assert (f.rule, f.action, f.code, f.severity, f.kind) == (G1, "advisory", SLOWER, "info", "performance")
    assert [(m.concurrency, m.mtp_vs_off, m.mtp_vs_unmitigated, m.above_max_num_seqs) for m in f.measurements] == [
        (32, 0.843, 0.662, False)
    ]
    m = f.measurements[0]
    assert m.vllm_version == "0.22.0" and m.tensor_parallel_size == 1 and "H100" in m.hardware
    assert m.model.startswith("prod-geometry") and m.fixture == "tests/fixtures/vllm-0.22.0-h100x2-prodmodel/mtp-graphs.json"
    assert "0.84x MTP off at concurrency 32" in f.message and "(defaulted)" in f.message
    assert "spec.maxNumSeqs below 32" in f.message and "speculativeDecoding.enabled: false" in f.workaround
    # the tiny model's losses (not representative) are evidence only
    assert "tiny" not in f.message and all("tiny" not in x.model for x in f.measurements)


def test_it_reaches_status_advisories_in_the_crd_shape():
    f = _one(evaluate(mk("0.22.0", model=G1_MODEL)))
    dumped = f.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["code"] == SLOWER and dumped["measurements"][0]["mtpVsOff"] == 0.843
    assert dumped["measurements"][0]["aboveMaxNumSeqs"] is False
    status = GDNModelServerStatus.model_validate({"advisories": [dumped]})
    assert status.advisories[0].measurements[0].concurrency == 32


@pytest.mark.parametrize(
    "fields, origin",
    [
        ({"cudagraphMode": "PIECEWISE"}, "as configured"),  # the user's own value
        ({"cudagraphMode": "FULL", "admissionPolicy": "mitigate"}, "applied by admission"),
    ],
)
def test_a_mitigation_set_or_applied_is_covered_alike(fields, origin):
    f = _one(evaluate(mk("0.22.0", model=G1_MODEL, **fields)))
    assert f.code == SLOWER and f"({origin})" in f.message


def test_an_operator_override_is_covered():
    spec = mk("0.22.0", model=G1_MODEL, cudagraphMode="FULL_AND_PIECEWISE")
    assert not evaluate(spec).allowed  # G1 refuses it under policy reject
    ev = evaluate(apply_overrides(spec, [{"path": "cudagraphMode", "value": "PIECEWISE", "reason": G1}]))
    assert ev.allowed and _one(ev).code == SLOWER


@pytest.mark.parametrize(
    "mns, code, above", [(16, SLOWER_ABOVE_RANGE, True), (31, SLOWER_ABOVE_RANGE, True), (32, SLOWER, False)]
)
def test_max_num_seqs_below_the_losing_concurrency_says_so_instead(mns, code, above):
    f = _one(evaluate(mk("0.22.0", model=G1_MODEL, maxNumSeqs=mns)))
    assert f.code == code and [m.above_max_num_seqs for m in f.measurements] == [above]
    if above:
        assert f"above this server's maxNumSeqs {mns} (spec.maxNumSeqs)" in f.message
        assert "Nothing to do while spec.maxNumSeqs stays below 32" in f.workaround


@pytest.mark.parametrize(
    "version, fields",
    [
        ("0.22.1", {"cudagraphMode": "PIECEWISE"}),  # a release no entry measured
        ("0.33.0", {"cudagraphMode": "PIECEWISE"}),
        ("0.22.0", {"speculativeDecoding": {"enabled": False}}),  # MTP off: nothing to lose to
        ("0.22.0", {"enforceEager": True}),  # eager: not the measured configuration
        ("0.22.0", {"tensorParallelSize": 2}),  # TP=2 was not measured
        ("0.22.0", {"speculativeDecoding": {"numSpeculativeTokens": 3}}),  # k=3 was not measured
    ],
)
def test_no_advisory_where_nothing_was_measured(version, fields):
    ev = evaluate(mk(version, model=G1_MODEL, **fields))
    assert ev.allowed and not _cost_advisories(ev), [f.message for f in _cost_advisories(ev)]


def test_a_refused_server_gets_no_cost_advisory():
    ev = evaluate(mk("0.22.0", model=G1_MODEL, cudagraphMode="FULL"))  # policy reject: nothing runs
    assert not ev.allowed and not _cost_advisories(ev)


def test_only_representative_entries_are_reported():
    # without the production-geometry entry, the tiny model's losses (0.86x even at concurrency 1) stay evidence
    raw = _raw()
    g1 = next(r for r in raw["rules"] if r["id"] == G1)
    g1["cost"] = [c for c in g1["cost"] if not c["representative"]]
    assert g1["cost"]
    ruleset = parse_rule_file(yaml.safe_dump(raw), "rules.yaml")
    eff = effective_config(mk("0.22.0", model=G1_MODEL, cudagraphMode="PIECEWISE", asyncScheduling=False))
    assert cost_findings(ruleset, eff) == []
    g1["cost"][0]["representative"] = True
    found = cost_findings(parse_rule_file(yaml.safe_dump(raw), "rules.yaml"), eff)
    assert [m.concurrency for m in found[0].measurements] == [1, 8, 32]


def test_a_launch_line_with_the_mitigation_is_covered():
    argv = [
        "vllm",
        "serve",
        "Qwen/Qwen3.5-27B",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
        "--no-async-scheduling",
        "--compilation-config",
        '{"cudagraph_mode":"PIECEWISE"}',
    ]
    _, ev = evaluate_launch(argv, vllm_version="0.22.0")
    assert ev.allowed and _one(ev).code == SLOWER
    _, ev = evaluate_launch([*argv[:5], *argv[6:]], vllm_version="0.22.0")  # async on: B2 refuses it at 0.22.0
    assert not _cost_advisories(ev)


def test_a_default_carries_its_measured_cost_in_status_or_says_unmeasured():
    """Unset means safe, and a safe default that costs throughput says what it costs per release (issue 32):
    status.effective.defaults[].cost, from the same cost entries as the advisory."""
    by_field = {d.field: d.cost for d in evaluate(mk("0.26.0")).effective.defaults}
    # issue 47: vllm#53051 resolves an unset cudagraphMode to PIECEWISE up to 0.28.0 (V1 runner), and the 0.26.0
    # async-scheduling measurement ran vLLM's FULL_AND_PIECEWISE graphs: it no longer covers the default server
    assert by_field["cudagraphMode"] == "unmeasured at vLLM 0.26.0 for this configuration"
    assert by_field["asyncScheduling"].startswith("unmeasured at vLLM 0.26.0 for this configuration; at vLLM 0.26.0 (")
    # the measurement itself still quotes for a server that runs its configuration (without the U4 default)
    raw = _raw()
    u4 = next(r for r in raw["rules"] if r["id"] == "vllm#53051")
    raw["rules"].remove(u4)
    ruleset = parse_rule_file(yaml.safe_dump(raw), "rules.yaml")
    eff = effective_config(mk("0.26.0", asyncScheduling=False))
    quoted = default_cost(ruleset, "asyncScheduling", eff)
    assert quoted.startswith("MTP with it 1.22x / 1.06x / 1.15x of MTP off at concurrency 1 / 8 / 32")
    assert "vLLM 0.26.0" in quoted and "vllm-0.26.0-h200x2-release" in quoted
    assert by_field["gdnPrefillBackend"] == "unmeasured at vLLM 0.26.0 for this configuration"
    g1 = {d.field: d.cost for d in evaluate(mk("0.22.0", model=G1_MODEL)).effective.defaults}["cudagraphMode"]
    assert "1.26x / 1.01x / 0.84x" in g1
    # a measurement at TP=1 does not cover TP=2: unmeasured there
    tp2 = {d.field: d.cost for d in evaluate(mk("0.26.0", tensorParallelSize=2)).effective.defaults}
    assert tp2["asyncScheduling"].startswith("unmeasured at vLLM 0.26.0 for this configuration; at vLLM 0.26.0 (")
    assert "TP=1)" in tp2["asyncScheduling"] and "MTP with it" not in tp2["asyncScheduling"]
