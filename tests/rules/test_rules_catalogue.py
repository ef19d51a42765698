"""The rule file itself: validated with pydantic at load; a malformed file is a clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gdn_operator.rules import load_rules
from gdn_operator.rules.rulefile import RuleFileError, default_rule_file, parse_rule_file
from gdn_operator.rules.predicates import PredicateError, compile_predicate
from gdn_operator.watch.signatures import default_catalogue


def _raw():
    return yaml.safe_load(default_rule_file().read_text())


def test_packaged_rule_file_loads_once():
    a = load_rules()
    assert a is load_rules()
    assert str(a.newest) == "0.34.0" and str(a.oldest) == "0.17.0" and len(a.releases) == 26
    # seed bugs and every configuration-triggered B-item are covered
    for ref in [
        "vllm#36917",
        "vllm#45100",
        "vllm#38041",
        "vllm#41190",
        "vllm#32716",
        "vllm#35447",
        "vllm#51562",
        "vllm#37035",
        "vllm#43559",
        "vllm#53912",
        "vllm#51571",
        "vllm#53962",
        "flashinfer#3329",
        "vllm#50708",
        "vllm#40756",
        "vllm#51508",
    ]:
        assert a.rule(ref) is not None, ref
    assert a.rule("vllm#53912").id == "vllm#43559"  # alias lookup


def test_texts_were_not_cut_by_yaml_comments():
    # a plain YAML scalar containing " #" is silently truncated; every text must keep balanced brackets
    cat = load_rules()
    texts = [t for r in cat.rules for t in (r.title, r.workaround, r.evidence, r.notes or "", r.advisory_reason or "")]
    texts += list(cat.patch_ids.values())
    for t in texts:
        assert t.count("(") == t.count(")"), t


def test_every_rule_cites_the_catalogue():
    """Catalogue rules cite the catalogue. The operator's own GPU findings (bug `G<n> (<fixture dir>)`, id
    gdn-operator/...) cite a committed capture that exists instead, and cover only the releases it ran on.
    Rules of the upstream sweeps after the catalogue (bug `U<n>`, issue 36) name an upstream issue as their id
    and the release wheels their range was read from; vLLM's own checks read in release wheels after the catalogue
    (bug `W<n>`, issue 46) name the wheels. A rule without a fix is open-ended unless it ends with what it needs
    (`ends_in`: the V1 runner, removed in vLLM 0.34.0)."""
    repo = Path(__file__).resolve().parents[2]
    for r in load_rules().rules:
        if r.bug.startswith("G"):
            m = re.fullmatch(r"G\d+ \((tests/fixtures/[\w.-]+)\)", r.bug)
            assert m and (repo / m.group(1)).is_dir(), (r.id, r.bug)
            assert r.id.startswith("gdn-operator/") and "bench/" in r.evidence, r.id
            continue
        if re.fullmatch(r"U\d+", r.bug):
            assert re.fullmatch(r"(vllm|flashinfer|LMCache)#\d+", r.id), r.id
            assert re.search(r"Release wheels read: .{0,80}?\b\d+\.\d+\.\d+", r.evidence), r.id
            if r.fixed_in is None:
                assert r.range.is_open_ended or r.ends_in, r.id
            continue
        if re.fullmatch(r"W\d+", r.bug):  # vLLM's own checks read in release wheels after the catalogue (issue 46)
            assert r.id.startswith("vllm-config/"), r.id
            assert re.search(r"Release wheels read: .{0,80}?\b\d+\.\d+\.\d+", r.evidence), r.id
            continue
        assert re.search(r"Catalogue (B\d+|§\d)", r.evidence), r.id
        if r.fixed_in is None:
            assert r.range.is_open_ended or r.ends_in or r.id.startswith("vllm-config/"), r.id


def _mutated(fn):
    raw = _raw()
    fn(raw)
    return yaml.safe_dump(raw)


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda r: r["rules"][0].update(kind="crashy"), r"rules\[0\] \(vllm#36917\)\.kind"),
        (lambda r: r["rules"][0].update(versions="<=banana"), "bad version"),
        (lambda r: r["rules"][0].update(when={"eval": "__import__('os')"}), "unknown operator 'eval'"),
        (lambda r: r["rules"][0].update(when={"eq": {"prefix_cachin": True}}), "unknown field 'prefix_cachin'"),
        (lambda r: r["rules"][0].update(mitigation={"asyncSchedulng": False}), "unknown spec field 'asyncSchedulng'"),
        (lambda r: r["rules"][0].update(patches=["gdn-guard/vllm-00000"]), "not declared in `patches`"),
        (lambda r: r["rules"][0].update(fields=["prefixCaching"]), "must be a spec path"),
        (lambda r: r["rules"][0].update(fixed_in="0.17.0"), "lies inside versions"),
        # issue 46: a rule that ends because what it needs left vLLM (ends_in), not because it was fixed
        (lambda r: r["rules"][0].update(ends_in="0.18.0", ends_why="the runner went"), "either fixed .* or ends"),
        (lambda r: r["rules"][0].update(fixed_in=None, ends_in="0.18.0"), "ends_in and ends_why go together"),
        (lambda r: r["rules"][0].update(fixed_in=None, ends_in="0.17.0", ends_why="x"), "must bound versions"),
        (lambda r: r["rules"][0].update(fixed_in=None, versions=">=0.17.0", ends_in="0.18.0", ends_why="x"), "must bound"),
        (lambda r: r["rules"][0].update(action="warn"), "needs advisory_reason"),
        (lambda r: r["rules"][0].update(id="36917"), "upstream reference"),
        (lambda r: r["rules"][1].update(id="vllm#36917"), "already used"),
        (lambda r: r["rules"][0].update(surprise=1), "Extra inputs"),
        (lambda r: r["builtin"].pop("unparseable-version"), "missing unparseable-version"),
    ],
)
def test_malformed_rule_file_is_a_clear_error(mutate, expect):
    with pytest.raises(RuleFileError) as ei:
        parse_rule_file(_mutated(mutate), "rules.yaml")
    text = "\n".join(ei.value.problems)
    assert re.search(expect, text), text
    assert all(p.startswith("rules.yaml: ") for p in ei.value.problems)


def test_malformed_yaml():
    with pytest.raises(RuleFileError, match="malformed YAML"):
        parse_rule_file("rules: [", "x.yaml")


@pytest.mark.parametrize(
    "pred, values, expected",
    [
        ({"eq": {"mtp": True}}, {"mtp": True}, True),
        ({"eq": {"tensor_parallel_size": True}}, {"tensor_parallel_size": 1}, False),  # bool is not 1
        ({"gte": {"num_speculative_tokens": 5}}, {"num_speculative_tokens": None}, False),
        ({"not": {"eq": {"mamba_cache_mode": "align"}}}, {"mamba_cache_mode": "none"}, True),
        ({"in": {"gdn_prefill_backend": ["flashinfer", "auto"]}}, {"gdn_prefill_backend": "auto"}, True),
        (
            {"any": [{"eq": {"mtp": False}}, {"lte": {"scheduled_token_budget": 0}}]},
            {"mtp": True, "scheduled_token_budget": -1792},
            True,
        ),
        ({"eq": {"env.NCCL_P2P_DISABLE": "1"}}, {}, False),
        # several fields in one eq: all must hold; bool is still not 1, None still needs None (not a missing 0)
        (
            {"eq": {"gdn_hybrid": True, "model_runner": "v1", "max_num_seqs": 8}},
            {"gdn_hybrid": True, "model_runner": "v1", "max_num_seqs": 8},
            True,
        ),
        ({"eq": {"gdn_hybrid": True, "model_runner": "v1"}}, {"gdn_hybrid": True, "model_runner": "v2"}, False),
        ({"eq": {"gdn_hybrid": True, "tensor_parallel_size": 1}}, {"gdn_hybrid": True, "tensor_parallel_size": True}, False),
        ({"eq": {"gdn_hybrid": 1, "mtp": True}}, {"gdn_hybrid": True, "mtp": True}, False),
        ({"eq": {"attention_kv_groups": None, "mtp": True}}, {"attention_kv_groups": 0, "mtp": True}, False),
        ({"eq": {"attention_kv_groups": None, "mtp": True}}, {"mtp": True}, True),
        ({"ne": {"mtp": True, "model_runner": "v1"}}, {"mtp": False, "model_runner": "v2"}, True),
        ({"has_arg": "--kv-cache-dtype"}, {"extra_args_flags": frozenset({"--kv-cache-dtype"})}, True),
    ],
)
def test_predicate_language(pred, values, expected):
    assert compile_predicate(pred)(values, None) is expected


def test_version_predicate_false_for_unparseable_version():
    p = compile_predicate({"version": "<0.23.0"})
    assert p({}, None) is False


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"all": []},
        {"eq": {"mtp": [1]}},
        {"gte": {"tensor_parallel_size": "2"}},
        {"eq": {"mtp": True}, "ne": {"mtp": False}},
        ["eq"],
    ],
)
def test_bad_predicates(bad):
    with pytest.raises(PredicateError):
        compile_predicate(bad)


def test_b12_fix_prs_that_name_the_same_index_are_aliases_issue_26():
    # PR #48475, PR #50021 and PR #56518 all bound `num_accepted_tokens - 1 = -1` (B12, PR #51508): a finding or
    # a crash naming any of them is the same defect, and the crash watch lists them beside vllm#51508.
    rule = next(r for r in load_rules().rules if r.id == "vllm#51508")
    assert set(rule.aliases) >= {"vllm#48475", "vllm#50021", "vllm#56518"}
    sig = next(s for s in default_catalogue().signatures if s.upstream == "vllm#51508")
    assert set(sig.related) >= {"vllm#48475", "vllm#50021", "vllm#56518"}
