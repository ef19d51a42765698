"""Our examples walk into no known hazard (issue 36).

Every example is evaluated under every rule, advisories included, as it would run (its own policy, the rules'
safe defaults filled in). A finding fails the test when a spec value avoids it: the rule has a mitigation (a
value of some field), or a release fixes it (spec.image.vllmVersion). What is left is an advisory that nothing
in a spec avoids (today vllm#41190 at TP >= 2 and vllm#40756 with MTP: no fix, no mitigation), listed as today.
An example whose file name starts with `denied-` shows a refusal and never runs: it must be refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rules_helpers import rules_of

from gdn_operator.api.load import load_file, parse_object
from gdn_operator.api.status import RuleFinding
from gdn_operator.rules import load_rules
from gdn_operator.rules.evaluator import Evaluation, evaluate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def avoidable(f: RuleFinding) -> str | None:
    """Why a spec value avoids this finding (None: nothing in a spec does)."""
    if f.mitigation:
        return f"mitigation {f.mitigation}"
    rule = load_rules().rule(f.rule)
    if rule is None:  # a built-in check of the spec itself (version, architecture, patch ids)
        return "a built-in check of spec values"
    if rule.fixed_in is not None:
        return f"fixed in vLLM {rule.fixed_in} (spec.image.vllmVersion)"
    return None


def hazards(ev: Evaluation) -> list[str]:
    return [f"{f.rule} ({f.action}): {why}" for f in ev.findings if (why := avoidable(f))]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_walks_into_no_avoidable_hazard(path):
    servers = load_file(str(path))
    assert servers
    for gms in servers:
        ev = evaluate(gms.spec)
        if path.name.startswith("denied-"):
            assert not ev.allowed and ev.rejected, path.name  # shows a refusal; never runs
            continue
        assert ev.allowed and ev.run_spec is not None and ev.run_spec.speculative_decoding.enabled
        assert hazards(ev) == [], path.name
        # what is left is listed, never hidden: advisories without a spec value that avoids them
        assert {f.action for f in ev.findings} <= {"advisory"}


def test_the_check_fails_on_the_397b_example_on_the_v1_runner():
    """The same check on the flagship multi-node example with the V1 runner: MTP + PP is a hazard there."""
    doc = yaml.safe_load((ROOT / "examples/qwen3.5-397b-a17b-2node.yaml").read_text())
    doc["spec"]["modelRunner"] = "v1"
    ev = evaluate(parse_object(doc).spec)
    assert "vllm#44697" in rules_of(ev, "rejected")
    assert any(h.startswith("vllm#44697 (rejected)") for h in hazards(ev))


def test_the_check_fails_on_the_397b_example_before_the_pp_fix():
    doc = yaml.safe_load((ROOT / "examples/qwen3.5-397b-a17b-2node.yaml").read_text())
    doc["spec"]["image"]["vllmVersion"] = "0.29.0"
    ev = evaluate(parse_object(doc).spec)
    assert "vllm#52069" in rules_of(ev, "rejected")
    assert {h.split(" ")[0] for h in hazards(ev)} >= {"vllm#52069", "vllm#51562"}  # 51562: fixed in 0.31.0


def test_the_check_keeps_advisories_nothing_avoids():
    doc = yaml.safe_load((ROOT / "examples/qwen3.5-397b-a17b-2node.yaml").read_text())
    ev = evaluate(parse_object(doc).spec)
    assert {"vllm#41190", "vllm#40756"} <= rules_of(ev, "advisory")
    assert hazards(ev) == []
