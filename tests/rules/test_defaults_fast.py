"""The admission hot path's safe defaults (issue 37 item 6) give exactly what validating every candidate whole gives.

rules/defaults.py builds each candidate of the defaults fixpoint with `SpecPatch.apply_model` (the changed fields
validated once per patch, the rest of the spec kept) instead of dumping, changing and validating the whole spec;
`evaluate(..., revalidate=True)` is that old path. Over the fuzz corpus of bench/bench_fuzz.py (the specs that
parse) and seeded random specs like bench/bench_rules.py's, under every policy, both give the same evaluation:
verdict, findings, defaults, effective configuration, patch, and the same resolved and run specs (values and the
fields marked set, which `exclude_unset` dumps and `user_set` read). `apply_model` itself equals the full
validation for every rule's mitigation on every such spec, refusals included.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules import evaluate, load_rules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from fuzz_corpus import manifest  # noqa: E402
from operator_harness import gms  # noqa: E402  (the cluster tests' base server, as bench_fuzz uses)

CAT = load_rules()
POLICIES = ("reject", "mitigate", "warn")
MODELS = [
    "hf://Qwen/Qwen3.5-27B",
    "hf://Qwen/Qwen3.6-35B-A3B",
    "hf://Qwen/Qwen3-Next-80B-A3B-Instruct",
    "hf://Qwen/Qwen3.8-27B",
    "hf://acme/finetune",
]


def _corpus_specs() -> list[GDNModelServerSpec]:
    import json

    rng, used, out = random.Random(11), set(), []  # bench_fuzz's seed
    for i in range(3000):
        _name, text = manifest(rng, i, used, gms)
        try:
            out.append(parse_spec(json.loads(text)["spec"]))
        except (ManifestError, ValueError, KeyError, TypeError, RecursionError):  # what the webhook refuses first
            continue
    return out


def _random_specs(n: int, seed: int) -> list[GDNModelServerSpec]:
    """Valid specs over the settings the rules read (bench_rules' mix, with every cudagraph mode and enforceEager)."""
    rng = random.Random(seed)
    versions = [*CAT.releases, "0.19.2rc1.dev226+g53b9640fb", "0.35.0", "latest"]
    patches = sorted([*CAT.patch_ids, *CAT.planned_patch_ids])
    out: list[GDNModelServerSpec] = []
    while len(out) < n:
        d: dict[str, Any] = {
            "model": {"uri": rng.choice(MODELS)},
            "image": {"tag": "t", "vllmVersion": rng.choice(versions), "patches": rng.sample(patches, rng.choice([0, 0, 1, 2]))},
            "tensorParallelSize": rng.choice([1, 2, 4, 8]),
            "speculativeDecoding": {
                "enabled": rng.random() < 0.9,
                "method": rng.choice(["mtp", "qwen3_next_mtp", "qwen3_5_mtp"]),
                "numSpeculativeTokens": rng.randint(1, 8),
            },
        }
        for key in ("asyncScheduling", "prefixCaching", "chunkedPrefill", "enforceEager"):
            c = rng.choice([None, None, True, False])
            if c is not None:
                d[key] = c
        for key, choices in (
            ("modelRunner", ["auto", "v1", "v2"]),
            ("attentionBackend", ["FLASHINFER", "FLASH_ATTN"]),
            ("gdnPrefillBackend", ["flashinfer", "triton", "cutedsl"]),
            ("cudagraphMode", ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]),
            ("admissionPolicy", ["reject", "mitigate", "warn"]),
        ):
            if rng.random() < 0.3:
                d[key] = rng.choice(choices)
        if rng.random() < 0.3:
            d["maxNumSeqs"] = rng.randint(1, 1024)
            d["maxNumBatchedTokens"] = rng.randint(256, 32768)
        try:
            out.append(GDNModelServerSpec.model_validate(d))
        except ValidationError:
            continue
    return out


SPECS = {"fuzz-corpus": _corpus_specs, "random": lambda: _random_specs(1500, 3)}


def _as_set(spec: GDNModelServerSpec | None) -> Any:
    """A spec's values and which fields are marked set (what exclude_unset dumps and user_set read)."""
    if spec is None:
        return None
    return spec.model_dump(by_alias=True, mode="json"), spec.model_dump(by_alias=True, exclude_unset=True, mode="json")


@pytest.mark.parametrize("corpus", sorted(SPECS))
def test_fast_defaults_give_the_revalidating_path_s_evaluation(corpus):
    specs = SPECS[corpus]()
    assert len(specs) > 300, "the corpus should hold many parsed specs"
    defaulted = 0
    for spec in specs:
        for policy in POLICIES:
            fast = evaluate(spec, default_policy=policy)
            slow = evaluate(spec, default_policy=policy, revalidate=True)
            assert fast.to_dict() == slow.to_dict(), (policy, spec.dump())
            assert _as_set(fast.resolved_spec) == _as_set(slow.resolved_spec), (policy, spec.dump())
            assert _as_set(fast.run_spec) == _as_set(slow.run_spec), (policy, spec.dump())
            defaulted += bool(fast.defaults)
    assert defaulted > len(specs) // 4, "the corpus should exercise the defaults fixpoint"


@pytest.mark.parametrize("corpus", sorted(SPECS))
def test_apply_model_equals_validating_the_changed_spec(corpus):
    """Every rule's mitigation on every spec: the same spec (values, fields set) or both refused."""
    specs = SPECS[corpus]()
    patches = [r.mitigation_patch for r in CAT.rules if r.mitigation_patch is not None]
    refused = fast_built = 0
    for spec in specs:
        submitted = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
        for patch in patches:
            try:
                want = GDNModelServerSpec.model_validate(patch.apply(submitted))
            except ValidationError:
                with pytest.raises(ValidationError):
                    patch.apply_model(spec)
                refused += 1
                continue
            fast_built += "_validated" in patch.__dict__  # the memo is learnt from the first full validation
            got = patch.apply_model(spec)
            assert got == want and _as_set(got) == _as_set(want), (patch.describe(), submitted)
    if corpus == "random":  # enforceEager: true refuses G1's cudagraphMode: PIECEWISE (a cross-field check)
        assert refused > 0, "some mitigation should be refused on some spec"
    assert fast_built > len(specs), "the fast path should have built most candidates"


@pytest.mark.parametrize("corpus", sorted(SPECS))
def test_findings_are_the_models_model_construct_makes(corpus):
    """rules/evaluator.construct_finding (model_construct without its per-field lookups) makes the RuleFinding that
    RuleFinding.model_construct makes: equal, the same fields marked set, the same dumps."""
    from gdn_operator.api.status import RuleFinding
    from gdn_operator.rules.evaluator import construct_finding

    seen = 0
    for spec in SPECS[corpus]()[:400]:
        for f in evaluate(spec, default_policy="mitigate").findings:
            values = {name: getattr(f, name) for name in RuleFinding.model_fields}
            want, got = RuleFinding.model_construct(**values), construct_finding(dict(values))
            assert got == want and got.model_fields_set == want.model_fields_set
            assert got.model_dump(by_alias=True, mode="json") == want.model_dump(by_alias=True, mode="json")
            assert got.model_dump(by_alias=True, exclude_unset=True) == want.model_dump(by_alias=True, exclude_unset=True)
            seen += 1
    assert seen > 100
    with pytest.raises(ValueError, match="exactly the fields"):
        construct_finding({"rule": "x"})
