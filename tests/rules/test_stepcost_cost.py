"""Step-cost figures into the product (issue 50 item 4): rules.yaml `cost` entries with ``basis: step-cost``
(rules/rulefile.py Cost, CostAcceptance), what they say in status.effective.defaults[].cost and in the
MTPSlowerThanOff advisory (rules/cost.py), and the generator the lead uses after the lease
(``bench/bench_gpu_stepcost.py --cost-entry CAPTURE GEOMETRY ACCEPTANCE``).

1. Every step-cost entry in rules.yaml is recomputed from its capture: vs_off = (1 + sum of its per-position
   acceptance) x t_off / t_k from the cells' median step costs, at exactly the decode concurrencies the capture
   measured; the engines it names ran the configuration it states. (None in rules.yaml yet: the H100 capture comes
   first; the generator's output on the committed dry-run capture gets the same check.)
2. The loader refuses a malformed step-cost entry with a clear error.
3. Such an entry, in a rule whose mitigation the server runs at that release, reaches the default's cost text and
   the advisory, with its model geometry, GPU, release, concurrencies and the acceptance it was projected at.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import REPO
from rules_helpers import mk

from gdn_operator.rules import effective_config, load_rules, stepcost
from gdn_operator.rules.cost import SLOWER, cost_findings, default_cost
from gdn_operator.rules.rulefile import Cost, RuleFileError, default_rule_file, parse_rule_file

sys.path.insert(0, str(REPO / "bench"))
import _stepcost_figures as fig  # noqa: E402

DRY = "tests/fixtures/vllm-0.33.0-stepcost-dryrun/stepcost.json"
RULE = "vllm#51508"  # asyncScheduling false up to 0.33.x (the dry run's release): what the rendered k=2 engine ran


def _entry(acceptance: str = "k2 c8") -> dict[str, Any]:
    return fig.cost_entry(json.loads((REPO / DRY).read_text()), DRY, "qwen3.5-27b", acceptance)


def check_step_cost_entry(c: Cost) -> None:
    """The recomputation a step-cost entry must pass (rules.yaml's and the generator's alike)."""
    doc = json.loads((REPO / c.fixture).read_text())
    mit, off = c.engines.mitigated, c.engines.mtp_off
    assert c.acceptance is not None and c.basis == "step-cost"
    pp = c.acceptance.per_position
    measured = [
        n
        for n in (1, 8, 32, 64)
        if (doc["cells"].get(mit, {}).get(f"c{n}") or {}).get("step_ms")
        and (doc["cells"].get(off, {}).get(f"c{n}") or {}).get("step_ms")
    ]
    assert [p.concurrency for p in c.points] == measured  # every measured concurrency, no picking
    for p in c.points:
        t_k = doc["cells"][mit][f"c{p.concurrency}"]["step_ms"]["median"]
        t_off = doc["cells"][off][f"c{p.concurrency}"]["step_ms"]["median"]
        assert p.vs_off == round(stepcost.tokens_per_step(pp) * t_off / t_k, 3)
        assert p.vs_unmitigated is None
    a, b = doc["engines"][mit]["argv"], doc["engines"][off]["argv"]
    assert json.loads(a[a.index("--speculative-config") + 1])["num_speculative_tokens"] == c.config["num_speculative_tokens"]
    assert ("--no-async-scheduling" in a) == (c.config["async_scheduling"] is False)
    assert ("--no-enable-prefix-caching" in a) == (c.config["prefix_caching"] is False)
    assert "--speculative-config" not in b and "--no-async-scheduling" not in b and "--no-enable-prefix-caching" not in b
    assert doc["vllm_version"] == c.vllm and c.hardware.endswith(doc["gpu"])
    geom = mit.split(":")[0]
    assert c.model_path == f"tests/fixtures/models-geometry/{geom}" and c.model.startswith(f"{geom} geometry")


STEP_COST_ENTRIES = [(r.id, i, c) for r in load_rules().costed for i, c in enumerate(r.cost) if c.basis == "step-cost"]


@pytest.mark.parametrize("rid, i, cost", STEP_COST_ENTRIES, ids=[f"{r}[{i}]" for r, i, _ in STEP_COST_ENTRIES])
def test_step_cost_entries_in_rules_yaml_are_their_capture(rid: str, i: int, cost: Cost):
    check_step_cost_entry(cost)
    assert not json.loads((REPO / cost.fixture).read_text())["dry_run"], "a dry run's figures are not evidence"


@pytest.mark.parametrize("acceptance", ["k2 c8", "k2 long", fig.PUBLISHED[0]["label"]])
def test_the_generated_entry_passes_the_same_check(acceptance: str):
    c = Cost.model_validate(_entry(acceptance))
    check_step_cost_entry(c)
    assert len(c.acceptance.per_position) == 2 if c.acceptance else False


def test_an_unknown_or_short_acceptance_is_refused():
    doc = json.loads((REPO / DRY).read_text())
    with pytest.raises(ValueError, match="not an oracle key"):
        fig.cost_entry(doc, DRY, "qwen3.5-27b", "whatever")
    with pytest.raises(ValueError, match="k=1, not k=2"):
        fig.cost_entry(doc, DRY, "qwen3.5-27b", "k1 c8")
    with pytest.raises(ValueError, match="k=2 needs 2"):
        fig.cost_entry(doc, DRY, "qwen3.5-27b", fig.PUBLISHED[1]["label"])


# ------------------------------------------------------------------------------------------- the loader


def _raw_with(entry: dict[str, Any], rule: str = RULE) -> dict[str, Any]:
    raw = yaml.safe_load(default_rule_file().read_text())
    r = next(x for x in raw["rules"] if x["id"] == rule)
    r["cost"] = [*r.get("cost", []), entry]
    return raw


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda e: e.pop("acceptance"), "basis step-cost needs `acceptance`"),
        (lambda e: e.update(basis="measured"), "only it has one"),
        (lambda e: e["acceptance"].update(per_position=[0.9]), "one rate per drafted token"),
        (lambda e: e["acceptance"].update(per_position=[0.5, 0.7]), "cannot grow with the position"),
        (lambda e: e["acceptance"].update(per_position=[1.5, 0.5]), r"in \[0, 1\]"),
        (lambda e: e.update(basis="guessed"), "basis"),
    ],
)
def test_a_malformed_step_cost_entry_is_a_clear_error(mutate, expect):
    e = _entry()
    mutate(e)
    with pytest.raises(RuleFileError) as ei:
        parse_rule_file(yaml.safe_dump(_raw_with(e)), "rules.yaml")
    text = "\n".join(ei.value.problems)
    assert RULE in text and re.search(expect, text), text


# ------------------------------------------------------------------------------------------- into status


def test_a_step_cost_entry_reaches_the_default_cost_and_the_advisory():
    e = _entry()
    ruleset = parse_rule_file(yaml.safe_dump(_raw_with(e)), "rules.yaml")
    eff = effective_config(mk("0.33.0", asyncScheduling=False, prefixCaching=False))
    text = default_cost(ruleset, "asyncScheduling", eff)
    ratios = " / ".join(f"{p['vs_off']:.2f}x" for p in e["points"])
    conc = " / ".join(str(p["concurrency"]) for p in e["points"])
    assert text.startswith(f"MTP with it {ratios} of MTP off at concurrency {conc} (vLLM 0.33.0, 1x dry run")
    assert (
        "qwen3.5-27b" in text and DRY in text and "projected from step costs at per-position acceptance 0.9934 / 0.9513" in text
    )
    lost = [p["concurrency"] for p in e["points"] if p["vs_off"] < 1]
    found = [f for f in cost_findings(ruleset, eff) if f.rule == RULE]
    if lost:  # the advisory fires from the step-cost curve where MTP with the defaults loses
        assert len(found) == 1 and found[0].code == SLOWER
        assert [m.concurrency for m in found[0].measurements] == lost
        assert all(m.vllm_version == "0.33.0" and m.model.startswith("qwen3.5-27b geometry") for m in found[0].measurements)
        assert "projected from step costs" in found[0].message
    else:
        assert found == []
    # a server the entry does not describe is not covered: MTP k=3, or another release
    assert "projected" not in default_cost(
        ruleset, "asyncScheduling", effective_config(mk("0.32.0", asyncScheduling=False, prefixCaching=False))
    )
    k3 = effective_config(
        mk("0.33.0", asyncScheduling=False, prefixCaching=False, speculativeDecoding={"numSpeculativeTokens": 3})
    )
    assert default_cost(ruleset, "asyncScheduling", k3).startswith("unmeasured")


def test_the_compatibility_matrix_names_the_basis():
    from gdn_operator.rules.compat import _measured
    from gdn_operator.rules.compatdoc import cost_text

    c = Cost.model_validate(_entry())
    assert "projected from step costs at per-position acceptance 0.9934 / 0.9513" in cost_text(_measured(RULE, c))
    measured = next(c for r in load_rules().costed for c in r.cost if c.basis == "measured")
    assert "projected" not in cost_text(_measured(RULE, measured))


def test_the_generator_prints_the_entry(tmp_path: Path):
    import subprocess

    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_gpu_stepcost.py"),
            "--cost-entry",
            str(REPO / Path(DRY).parent),
            "qwen3.5-27b",
            "k2 c8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == _entry()
