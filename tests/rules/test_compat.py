"""The compatibility matrix (issue 32 item 4): docs/compatibility.md is what hack/gen_compat.py prints; the verdict
logic on a synthetic rule set (refused / mitigated with a measured cost / mitigated with the cost unmeasured /
safe); the GPU evidence read from the captures' own engine start-up lines, a new capture folder picked up.
"""

from __future__ import annotations

import re
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml
from paths import CPU_CAPTURES
from paths import REPO as ROOT

from gdn_operator.rules import load_rules
from gdn_operator.rules.compat import (
    Axes,
    Capture,
    Measured,
    Mitigation,
    engine_of,
    engines_of_json,
    judge,
    matrix,
    scan_captures,
)
from gdn_operator.rules.compatdoc import details, groups, link, render
from gdn_operator.rules.rulefile import RuleSet, default_rule_file, parse_rule_file

DOC = ROOT / "docs" / "compatibility.md"
G1 = "gdn-operator/mtp-full-decode-cudagraph"
PRODMODEL = "tests/fixtures/vllm-0.22.0-h100x2-prodmodel"


@pytest.mark.readme(".venv/bin/python hack/gen_compat.py > docs/compatibility.md")
def test_committed_matrix_is_what_the_generator_prints():
    res = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_compat.py")], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == DOC.read_text(), (
        "docs/compatibility.md is stale: run `.venv/bin/python hack/gen_compat.py > docs/compatibility.md` and commit it"
    )


# ---- verdicts on a synthetic rule set -----------------------------------------------------------------

#: two rules: vllm#1 refuses MTP before 0.26.0 (its mitigation turns MTP off, never a default); vllm#2's
#: mitigation asyncScheduling false is the safe default, measured at 0.26.0 on TP=1 only
SYNTHETIC_RULES = [
    {
        "id": "vllm#1",
        "bug": "T1",
        "title": "synthetic: MTP crashes before 0.26.0",
        "kind": "runtime-crash",
        "severity": "critical",
        "versions": "<0.26.0",
        "fixed_in": "0.26.0",
        "when": {"eq": {"gdn_hybrid": True, "mtp": True}},
        "fields": ["spec.speculativeDecoding"],
        "workaround": "Upgrade, or turn MTP off.",
        "mitigation": {"speculativeDecoding.enabled": False},
        "evidence": "synthetic rule of tests/rules/test_compat.py",
    },
    {
        "id": "vllm#2",
        "bug": "T2",
        "title": "synthetic: MTP with async scheduling corrupts output",
        "kind": "silent-corruption",
        "severity": "high",
        "versions": "*",
        "when": {"eq": {"gdn_hybrid": True, "mtp": True, "async_scheduling": True}},
        "fields": ["spec.asyncScheduling"],
        "workaround": "Set asyncScheduling false.",
        "mitigation": {"asyncScheduling": False},
        "evidence": "synthetic rule of tests/rules/test_compat.py",
        "cost": [
            {
                "vllm": "0.26.0",
                "hardware": "1x NVIDIA H200",
                "model": "prod-geometry (synthetic)",
                "model_path": "tests/models/prod-geometry",
                "representative": True,
                "fixture": "tests/fixtures/vllm-0.26.0-h200x2-release/mtp.json",
                "engines": {"mitigated": "mtp", "mtp_off": "nomtp"},
                "config": {"mtp": True, "num_speculative_tokens": 2, "async_scheduling": False, "tensor_parallel_size": 1},
                "baseline": "MTP off with vLLM's defaults",
                "points": [{"concurrency": 1, "vs_off": 1.1}, {"concurrency": 32, "vs_off": 0.9}],
            },
            {  # not representative: evidence only, never reported
                "vllm": "0.26.0",
                "hardware": "1x NVIDIA H200",
                "model": "tiny",
                "model_path": "tests/models/tiny-qwen3-next-recall",
                "representative": False,
                "why": "too small to say anything about served models",
                "fixture": "tests/fixtures/vllm-0.26.0-h200x2-release/tiny.json",
                "engines": {"mitigated": "mtp", "mtp_off": "nomtp"},
                "config": {"mtp": True, "num_speculative_tokens": 2, "async_scheduling": False, "tensor_parallel_size": 1},
                "baseline": "MTP off with vLLM's defaults",
                "points": [{"concurrency": 1, "vs_off": 0.5}],
            },
        ],
    },
]
RELEASES = ["0.22.0", "0.26.0", "0.32.0", "0.33.0"]


@pytest.fixture(scope="module")
def synthetic() -> RuleSet:
    raw = yaml.safe_load(default_rule_file().read_text())
    raw["catalogue"] = {**raw["catalogue"], "oldest": RELEASES[0], "newest": RELEASES[-1], "releases": RELEASES}
    raw["rules"] = SYNTHETIC_RULES
    return parse_rule_file(yaml.safe_dump(raw), "synthetic")


MEASURED = Measured(
    "vllm#2", "1x NVIDIA H200", "prod-geometry (synthetic)", ((1, 1.1), (32, 0.9)), SYNTHETIC_RULES[1]["cost"][0]["fixture"]
)


def test_a_refused_cell_names_the_enforced_rule_and_links_it_upstream(synthetic):
    cell = judge(synthetic, Axes("0.22.0", 1, "default", True))
    assert (cell.verdict, cell.refused, cell.mitigations) == ("refused", ("vllm#1",), ())
    assert "refused by [vllm#1](https://github.com/vllm-project/vllm/issues/1)" in details(cell)


def test_mtp_off_with_no_finding_is_safe(synthetic):
    for release in RELEASES:
        cell = judge(synthetic, Axes(release, 2, "eager", False))
        assert (cell.verdict, cell.refused, cell.mitigations, cell.advisories) == ("safe", (), (), ())


def test_a_mitigated_cell_carries_the_rules_measured_cost_where_a_capture_covers_it(synthetic):
    cell = judge(synthetic, Axes("0.26.0", 1, "default", True))
    assert cell.verdict == "mitigated"
    assert cell.mitigations == (Mitigation("asyncScheduling", False, "vllm#2", (MEASURED,)),)  # not the tiny entry
    assert cell.as_shipped == ("vllm#2",)  # async scheduling on (vLLM's default with MTP) is refused
    assert cell.evidence == ("tests/fixtures/vllm-0.26.0-h200x2-release",)  # the cost's fixture backs the cell
    text = details(cell)
    assert "MTP/off 1.10x / 0.90x at 1 / 32 in flight (1x NVIDIA H200, prod-geometry)" in text
    assert "cost unmeasured" not in text


def test_the_cost_of_a_default_is_found_on_another_rule_that_asks_for_the_same_value(synthetic):
    """The default names the most severe rule (vllm#2); a measurement of the same value on a warn-only rule
    (vllm#3, the same mitigation) is still that default's cost, not something the cell sets itself."""
    raw = yaml.safe_load(default_rule_file().read_text())
    raw["catalogue"] = synthetic.data.catalogue.model_dump()
    enforced = {k: v for k, v in SYNTHETIC_RULES[1].items() if k != "cost"}
    warn = {
        **SYNTHETIC_RULES[1],
        "id": "vllm#3",
        "severity": "low",
        "action": "warn",
        "advisory_reason": "synthetic: a second report of the same trigger",
    }
    raw["rules"] = [enforced, warn]
    rules = parse_rule_file(yaml.safe_dump(raw), "synthetic-2")
    cell = judge(rules, Axes("0.26.0", 1, "default", True))
    assert cell.mitigations == (Mitigation("asyncScheduling", False, "vllm#2", (replace(MEASURED, rule="vllm#3"),)),)
    assert cell.measured == ()


@pytest.mark.parametrize("a", [Axes("0.26.0", 2, "default", True), Axes("0.33.0", 1, "default", True)], ids=["tp2", "0.33.0"])
def test_a_mitigated_cell_no_capture_measured_says_cost_unmeasured(synthetic, a):
    cell = judge(synthetic, a)
    assert cell.verdict == "mitigated"
    assert cell.mitigations == (Mitigation("asyncScheduling", False, "vllm#2", ()),)
    assert cell.evidence == ()
    assert "`asyncScheduling: false` ([vllm#2](https://github.com/vllm-project/vllm/issues/2); cost unmeasured)" in details(cell)


def test_consecutive_releases_with_the_same_cells_are_one_group(synthetic):
    cells = matrix(synthetic)
    assert len(cells) == len(RELEASES) * 2 * 3 * 2
    assert [rs for rs, _ in groups(cells)] == [["0.22.0"], ["0.26.0"], ["0.32.0", "0.33.0"]]
    doc = render(synthetic, cells, [])
    assert "### vLLM 0.32.0 – 0.33.0" in doc and "[0.32.0 – 0.33.0](#vllm-0320--0330)" in doc


def test_rule_links():
    assert link("flashinfer#3329") == "[flashinfer#3329](https://github.com/flashinfer-ai/flashinfer/issues/3329)"
    assert link(G1) == f"[{G1}](../operator/gdn_operator/rules/data/rules.yaml)"


# ---- GPU evidence from the captures' engine start-up lines ---------------------------------------------


def _startup_line(release: str) -> str:
    log = (ROOT / PRODMODEL / "serve-mtp-full.log").read_text()
    line = next(ln for ln in log.splitlines() if "LLM engine (v0.22.0) with config:" in ln)
    return line.replace("(v0.22.0)", f"(v{release})")


def test_engine_logs_say_what_ran():
    read = {p.name: engine_of(p.read_text()) for p in (ROOT / PRODMODEL).glob("serve-*.log")}
    assert read == {
        "serve-mtp-full.log": ("0.22.0", 1, "FULL_AND_PIECEWISE", True, 2),
        "serve-mtp.log": ("0.22.0", 1, "PIECEWISE", True, 2),
        "serve-nomtp.log": ("0.22.0", 1, "FULL_AND_PIECEWISE", False, None),
    }
    assert engine_of("INFO engine started\n(APIServer) ready\n") is None
    # the start-up line reads the same at the newest release the project runs (vLLM 0.32.0, CPU engine capture)
    assert engine_of((CPU_CAPTURES / "serve-startup-mtp2.log").read_text()) == ("0.32.0", 1, "NONE", True, 2)


MTP_ARGV = ["m", "--tensor-parallel-size", "1", "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']


def test_json_captures_give_the_ready_engines_command_lines():
    prodmodel = (ROOT / PRODMODEL / "mtp-graphs.json").read_text()
    assert engines_of_json(prodmodel, "0.22.0") == [
        ("/engines/mtp", 1, "PIECEWISE", True, 2),
        ("/engines/nomtp", 1, "auto", False, None),
        ("/engines/mtp-full", 1, "auto", True, 2),
    ]
    assert engines_of_json(prodmodel, "0.26.0") == []  # the capture records another release
    synthetic = {
        "runs": [
            {"argv": [*MTP_ARGV, "--enforce-eager"], "ready_s": 12.5},
            {"argv": ["m", "--tensor-parallel-size", "4"], "ready_s": 30},
            {"argv": MTP_ARGV, "started": False},  # never became ready: no evidence
        ]
    }
    assert engines_of_json(json.dumps(synthetic), "0.26.0") == [
        ("/runs[0]", 1, "NONE", True, 2),
        ("/runs[1]", 4, "auto", False, None),
    ]
    assert engines_of_json("not json", "0.26.0") == []


def test_a_new_capture_folder_is_picked_up(tmp_path, synthetic):
    new = tmp_path / "tests" / "fixtures" / "vllm-0.26.0-h200x2-release"
    (new / "logs").mkdir(parents=True)
    (new / "logs" / "serve-mtp.log").write_text("INFO starting\n" + _startup_line("0.26.0") + "\n")
    (new / "serve-other-release.log").write_text(_startup_line("0.25.0") + "\n")  # not this folder's release
    (new / "bench.json").write_text(json.dumps({"vllm_version": "0.26.0", "engines": {"off": {"argv": ["m"], "ready_s": 9}}}))
    (tmp_path / "tests" / "fixtures" / "logs").mkdir()
    (tmp_path / "tests" / "fixtures" / "logs" / "x.log").write_text(_startup_line("0.26.0"))  # not a capture folder
    caps = scan_captures(tmp_path)
    assert caps == [
        Capture(
            "tests/fixtures/vllm-0.26.0-h200x2-release",
            "logs/serve-mtp.log",
            "h200x2",
            "0.26.0",
            1,
            "default",
            "FULL_AND_PIECEWISE",
            True,
            2,
        ),
        Capture(
            "tests/fixtures/vllm-0.26.0-h200x2-release",
            "bench.json#/engines/off",
            "h200x2",
            "0.26.0",
            1,
            "default",
            "auto",
            False,
            None,
        ),
    ]
    backed = judge(synthetic, Axes("0.26.0", 1, "default", True), caps)
    assert backed.evidence == ("tests/fixtures/vllm-0.26.0-h200x2-release",)
    # (the synthetic cost's fixture is in the same folder: it backs every cell its TP=1 measurement covers)
    assert judge(synthetic, Axes("0.26.0", 1, "default", False), caps).evidence == ("tests/fixtures/vllm-0.26.0-h200x2-release",)
    for other in (Axes("0.26.0", 2, "default", True), Axes("0.26.0", 1, "eager", False), Axes("0.33.0", 1, "default", True)):
        assert judge(synthetic, other, caps).evidence == (), other
    unmeasured = Capture(caps[0].folder + "-x", "b.log", "h200", "0.26.0", 2, "PIECEWISE", "PIECEWISE", True, 2)
    assert judge(synthetic, Axes("0.26.0", 2, "PIECEWISE", True), [unmeasured]).evidence == (unmeasured.folder,)
    assert judge(synthetic, Axes("0.26.0", 2, "default", True), [unmeasured]).evidence == ()


# ---- the real rules and captures ------------------------------------------------------------------------


def test_the_real_matrix_at_the_releases_users_ask_about():
    rules = load_rules()
    cells = {c.axes: c for c in matrix(rules, scan_captures(ROOT))}
    assert len(cells) == len(rules.releases) * 12
    old = cells[Axes("0.17.0", 1, "eager", True)]
    assert (old.verdict, old.refused) == ("refused", ("vllm#36917",))  # B1: MTP before 0.18.0
    # Qwen3.5-27B forms one attention KV-cache group (issue 33): G1 sets no PIECEWISE for it at 0.22.0
    g1 = cells[Axes("0.22.0", 1, "default", True)]
    assert not any(m.rule == G1 for m in g1.mitigations) and PRODMODEL in g1.evidence
    # ... but vllm#53051 (issue 47) does: V1 runner + vLLM's FULL graphs up to 0.28.0
    assert any(m.rule == "vllm#53051" and m.field == "cudagraphMode" for m in g1.mitigations)
    # the async-scheduling default at 0.26.0: the 0.26.0 capture measured it with vLLM's FULL_AND_PIECEWISE graphs,
    # which the default server no longer runs there (vllm#53051 makes it PIECEWISE): no cost is claimed for it
    rule = rules.rule("vllm#53962")
    assert rule is not None
    cost = next(c for c in rule.cost if c.representative and c.vllm == "0.26.0")
    assert cost.config["cudagraph_mode"] == "auto"
    at26 = next(m for m in cells[Axes("0.26.0", 1, "default", True)].mitigations if m.field == "asyncScheduling")
    assert at26.costs == ()
    tp2 = next(m for m in cells[Axes("0.26.0", 2, "default", True)].mitigations if m.field == "asyncScheduling")
    assert tp2.costs == ()  # measured at TP=1 only
    newest = cells[Axes("0.33.0", 1, "default", True)]
    assert newest.verdict == "mitigated" and {m.field for m in newest.mitigations} >= {"prefixCaching", "asyncScheduling"}
    assert all(not m.costs for m in newest.mitigations) and newest.evidence == ()


def test_every_relative_link_of_the_matrix_resolves_in_the_checkout():
    targets = set(re.findall(r"\]\((\.\./[^)#\s]+)\)", DOC.read_text()))
    assert any("tests/fixtures/" in t for t in targets) and any(t.endswith("rules.yaml") for t in targets)
    missing = sorted(t for t in targets if not (DOC.parent / t).resolve().exists())
    assert not missing, missing
