"""Evidence that ties a crash to an upstream issue: facts from the log, and from the spec the operator rendered.

A signature may name an upstream issue only when its `attribution` holds (data/signatures.yaml): every
`needs` fact is known to have the stated value, no `excludes` fact is known to have its value, and a known
vLLM version lies in `versions` (with no version known, the issue is named with the releases it holds for:
`unknown_version`). Facts come from the log (`facts:` in the catalogue: `Resolved
architecture: Qwen3_5ForConditionalGeneration`, `Using FlashInfer GDN prefill kernel`, ...) and from
the spec (`Evidence.from_spec`); where both say something, the spec wins (it is what was deployed), and a
disagreement is reported (`contradictions`), never dropped silently. The log's family evidence is its
resolved-architecture line and the model's own frames (qwen3_next.py / qwen3_5.py); see rules/family.py for the
order of the launch line's sources.
`gdnctl classify-log --spec manifest.yaml --vllm-version X` passes the same evidence offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gdn_operator.api.load import load_file
from gdn_operator.rules.effective import effective_config
from gdn_operator.versions import parse_version

if TYPE_CHECKING:
    from gdn_operator.api.spec import GDNModelServerSpec
    from gdn_operator.watch.catalogue import Attribution


@dataclass(frozen=True)
class Evidence:
    """Known facts about the server (fact -> value) and the vLLM version it runs, with where each came from."""

    facts: dict[str, str] = field(default_factory=dict)
    vllm_version: str | None = None
    source: str = "spec"

    @classmethod
    def from_spec(cls, spec: GDNModelServerSpec, vllm_version: str | None = None) -> Evidence:
        """Facts the operator knows from a spec (model family, speculative decoding, GDN prefill backend)."""
        v = effective_config(spec, vllm_version).values
        facts: dict[str, str] = {}
        if v.get("gdn_hybrid"):
            facts["family"] = "gdn-hybrid"  # an unrecognised name stays unknown: never guessed
        facts["spec_decode"] = "on" if v.get("spec_enabled") else "off"
        backend = getattr(spec.gdn_prefill_backend, "value", spec.gdn_prefill_backend)
        if backend in ("flashinfer", "triton"):
            facts["gdn_prefill_backend"] = backend
        elif backend is not None:
            facts["gdn_prefill_backend"] = "other"
        return cls(facts, vllm_version or spec.image.vllm_version, "spec")

    @classmethod
    def from_manifest(cls, path: str, vllm_version: str | None = None) -> Evidence:
        """Evidence from the first GDNModelServer document of a manifest file (ManifestError if invalid)."""
        return cls.from_spec(load_file(path)[0].spec, vllm_version)

    @classmethod
    def version_only(cls, vllm_version: str | None) -> Evidence:
        return cls({}, vllm_version, "--vllm-version")


def merge(
    log_facts: dict[str, str], log_version: str | None, evidence: Evidence | None
) -> tuple[dict[str, str], str | None, dict[str, str]]:
    """(facts, version, fact -> source) with the spec's facts over the log's."""
    facts = dict(log_facts)
    sources = {k: "log" for k in facts}
    version = log_version
    if evidence is not None:
        for k, v in evidence.facts.items():
            facts[k] = v
            sources[k] = evidence.source
        if evidence.vllm_version:
            version = evidence.vllm_version
    if version:
        sources["vllm_version"] = evidence.source if evidence is not None and evidence.vllm_version else "log"
    return facts, version, sources


def contradictions(log_facts: dict[str, str], evidence: Evidence | None) -> list[str]:
    """Facts the log and the spec state differently (issue 26: reported, not silently resolved). The spec's
    value is the one used (it is what was deployed); the log's is shown beside it."""
    if evidence is None:
        return []
    return [
        f"{k}: the log says {log_facts[k]}, the {evidence.source} says {v}; the {evidence.source}'s value is used"
        for k, v in sorted(evidence.facts.items())
        if k in log_facts and log_facts[k] != v
    ]


def unknown_version(attr: Attribution | None, version: str | None) -> str | None:
    """The releases an attribution holds for, when neither the log nor the spec gives the vLLM version (issue 47:
    the issue is still named on the rest of the evidence, and the result says which versions it would be)."""
    if attr is None or attr.versions is None or version:
        return None
    return str(attr.versions)


def check(attr: Attribution, facts: dict[str, str], version: str | None) -> str | None:
    """None when the attribution holds, else what is missing or contradicting (one line)."""
    problems = []
    for k, v in attr.needs:
        have = facts.get(k)
        if have != v:
            problems.append(f"needs {k}={v} ({'unknown' if have is None else have})")
    for k, v in attr.excludes:
        if facts.get(k) == v:
            problems.append(f"{k}={v} rules it out")
    if attr.versions is not None and version:
        ver = parse_version(version)
        if ver is not None and not attr.versions.contains(ver):
            problems.append(f"vLLM {version} is outside the affected releases {attr.versions}")
    return "; ".join(problems) or None
