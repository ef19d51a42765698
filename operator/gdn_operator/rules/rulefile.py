"""Loading and validating the rule file (data/rules.yaml) into a `RuleSet` — once, cached.

A malformed rule file is a `RuleFileError` listing every problem (one line each) the first time the
rules are loaded (import of the evaluator, or the tests), never a surprise during admission. (The
file's `catalogue:` section names the range of vLLM releases the known-issues catalogue,
../shared/docs/vllm-known-issues.md, was checked against.)

Size (~510 lines): the rule file's schema (rules, costs, patches, the catalogue) and the cross-checks between its
parts (ids, aliases, mitigations against costs, ranges against `ends_in`) read one parsed document; split, each half
would re-read the other's models.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gdn_operator.api.specpatch import SpecPatch, check_path
from gdn_operator.api.vllm_args import table_versions
from gdn_operator.datafiles import load_yaml, once
from gdn_operator.rules.effective import FIELDS
from gdn_operator.rules.predicates import PredicateError, compile_predicate, referenced_fields
from gdn_operator.rules.stepcost import tokens_per_step
from gdn_operator.versions import Version, VersionKey, VersionRange, parse_version, require_version

#: What a rule is about (not the crash watch's signature kinds, watch/catalogue.py KINDS).
RuleKind = Literal["startup-crash", "runtime-crash", "silent-corruption", "deadlock", "config"]
Severity = Literal["critical", "high", "medium", "low", "info"]
SEVERITIES: tuple[str, ...] = get_args(Severity)
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

_ID_RE = re.compile(r"^(?:[a-z0-9][a-z0-9_.-]*#\d+|vllm-config/[a-z0-9-]+|gdn-operator/[a-z0-9-]+)$")
_PATCH_RE = re.compile(r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9._-]*$")


class RuleFileError(Exception):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid rule file:\n  " + "\n  ".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class CostPoint(_Strict):
    """tokens/s ratios at one concurrency (requests in flight to one engine)."""

    concurrency: int = Field(ge=1)
    #: MTP with the mitigation / MTP off (vLLM's defaults): below 1.0 the mitigated MTP loses to no MTP
    vs_off: float = Field(gt=0)
    #: MTP with the mitigation / the same MTP without it (where that configuration was measured)
    vs_unmitigated: float | None = Field(default=None, gt=0)


class CostEngines(_Strict):
    """The names the fixture gives the measured engines (the CPU test recomputes the ratios from them)."""

    mitigated: str
    mtp_off: str
    unmitigated: str | None = None


class CostAcceptance(_Strict):
    """The acceptance a step-cost entry's speed-ups are projected at (rules/stepcost.py): unconditional per-position
    rates (vLLM's per-position counters / drafts), one per drafted token, and where they come from."""

    per_position: list[float] = Field(min_length=1)
    source: str = Field(min_length=5)

    @field_validator("per_position")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        tokens_per_step(v)  # in [0, 1] and not growing with the position, else ValueError
        return v


class Cost(_Strict):
    """What a rule's mitigation measurably costs: one GPU capture of MTP with it against MTP off.

    `config` is the effective configuration (rules/effective.py FIELDS names) the mitigated engine ran; it
    holds the rule's mitigation, and a server is covered by the measurement only where its own effective
    values equal all of it at the same vLLM release (rules/cost.py)."""

    vllm: str
    hardware: str = Field(min_length=3)
    model: str = Field(min_length=3)
    model_path: str
    representative: bool
    why: str | None = None
    fixture: str
    engines: CostEngines
    config: dict[str, Any] = Field(min_length=1)
    baseline: str = Field(min_length=5)
    points: list[CostPoint] = Field(min_length=1)
    note: str | None = None
    #: "measured": tokens/s of trained engines (vs_off is their ratio); "step-cost": step costs of dummy-weight
    #: engines at a real model geometry, vs_off projected at `acceptance` (issue 50, bench/bench_gpu_stepcost.py)
    basis: Literal["measured", "step-cost"] = "measured"
    acceptance: CostAcceptance | None = None
    #: `vllm` parsed (excluded from the schema)
    version: Any = Field(default=None, exclude=True)

    @field_validator("vllm")
    @classmethod
    def _ver(cls, v: str) -> str:
        if parse_version(v) is None:
            raise ValueError(f"{v!r} is not a version")
        return v

    @field_validator("fixture", "model_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith(("tests/", "shared/")) or ".." in v.split("/"):
            raise ValueError(
                f"{v!r} must be a path in the checkout (tests/...) or in the shared facts folder beside it (shared/...)"
            )
        return v

    @field_validator("config")
    @classmethod
    def _config(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(k for k in v if k not in FIELDS)
        if unknown:
            raise ValueError(f"unknown effective field(s) {', '.join(unknown)} (known: {', '.join(sorted(FIELDS))})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Cost:
        if not self.representative and not self.why:
            raise ValueError("a measurement that is not representative needs `why`")
        conc = [p.concurrency for p in self.points]
        if conc != sorted(set(conc)):
            raise ValueError("points: concurrencies must be distinct and in increasing order")
        if self.engines.unmitigated is None and any(p.vs_unmitigated is not None for p in self.points):
            raise ValueError("vs_unmitigated needs engines.unmitigated (the fixture's name for that engine)")
        if (self.basis == "step-cost") != (self.acceptance is not None):
            raise ValueError("basis step-cost needs `acceptance` (per_position, source), and only it has one")
        k = self.config.get("num_speculative_tokens")
        if self.acceptance is not None and len(self.acceptance.per_position) != k:
            raise ValueError(f"acceptance.per_position needs one rate per drafted token (num_speculative_tokens {k})")
        object.__setattr__(self, "version", parse_version(self.vllm))
        return self


class Reproduction(_Strict):
    """A GPU run aimed at a rule's trigger: whether the defect showed, and what the rule's mitigated value cost
    there. tests/rules/test_reproductions.py recomputes every figure `result` and `default_cost` quote from the
    fixture. `default_cost` is what status.effective.defaults[].cost quotes at a release no `cost` entry measured
    (rules/cost.py default_cost), always with the release it was measured at."""

    vllm: str
    hardware: str = Field(min_length=3)
    model: str = Field(min_length=3)
    tensor_parallel_size: int = Field(default=1, ge=1)
    fixture: str
    reproduced: bool
    result: str = Field(min_length=10)
    default_cost: str | None = None

    @field_validator("vllm")
    @classmethod
    def _ver(cls, v: str) -> str:
        if parse_version(v) is None:
            raise ValueError(f"{v!r} is not a version")
        return v

    @field_validator("fixture")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("tests/fixtures/") or ".." in v.split("/"):
            raise ValueError(f"{v!r} must be a committed capture under tests/fixtures/")
        return v


class Rule(_Strict):
    id: str
    aliases: list[str] = Field(default_factory=list)
    bug: str
    title: str = Field(min_length=5)
    kind: RuleKind
    severity: Severity
    action: Literal["enforce", "warn"] = "enforce"
    advisory_reason: str | None = None
    escalate_if: dict[str, Any] | None = None
    versions: str
    fixed_in: str | None = None
    #: the first release the rule cannot apply to because what it needs is gone from vLLM (not a fix): e.g. the
    #: V1 model runner, removed in 0.34.0; `ends_why` says what went, read where
    ends_in: str | None = None
    ends_why: str | None = None
    patches: list[str] = Field(default_factory=list)
    when: dict[str, Any]
    fields: list[str] = Field(min_length=1)
    workaround: str = Field(min_length=5)
    mitigation: dict[str, Any] | None = None
    evidence: str = Field(min_length=10)
    notes: str | None = None
    #: measured cost of `mitigation` (tokens/s of MTP with it against MTP off), per vLLM release and model
    cost: list[Cost] = Field(default_factory=list)
    #: GPU runs aimed at the trigger (reproduced or not), newest last
    reproductions: list[Reproduction] = Field(default_factory=list)

    # compiled at validation time (excluded from the schema)
    compiled_when: Any = Field(default=None, exclude=True)
    compiled_escalate: Any = Field(default=None, exclude=True)
    #: `mitigation` as the spec change the evaluator applies (None without one)
    mitigation_patch: SpecPatch | None = Field(default=None, exclude=True)
    range: Any = Field(default=None, exclude=True)
    #: the effective values matching reads for this rule (when, escalate_if, the patches that neutralise it)
    reads: frozenset[str] = Field(default=frozenset(), exclude=True)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError("must be an upstream reference like vllm#36917 (or vllm-config/NAME)")
        return v

    @field_validator("versions")
    @classmethod
    def _versions(cls, v: str) -> str:
        VersionRange(v)  # raises ValueError with a clear message
        return v

    @field_validator("fixed_in", "ends_in")
    @classmethod
    def _fixed(cls, v: str | None) -> str | None:
        if v is not None and parse_version(v) is None:
            raise ValueError(f"{v!r} is not a version")
        return v

    @field_validator("patches")
    @classmethod
    def _patch_ids(cls, v: list[str]) -> list[str]:
        for p in v:
            if not _PATCH_RE.match(p):
                raise ValueError(f"patch id {p!r} must look like gdn-guard/vllm-36917")
        return v

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p.startswith("spec."):
                raise ValueError(f"field {p!r} must be a spec path such as spec.prefixCaching")
            why = check_path(p[len("spec.") :])
            if why:
                raise ValueError(why)
        return v

    @field_validator("mitigation")
    @classmethod
    def _mitigation(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty mitigation does nothing; leave it out")
        for path in v:
            why = check_path(path)
            if why:
                raise ValueError(
                    why + " (mitigation keys are camelCase spec paths like speculativeDecoding.numSpeculativeTokens)"
                )
        return v

    @model_validator(mode="after")
    def _compile(self) -> Rule:
        try:
            object.__setattr__(self, "compiled_when", compile_predicate(self.when, "when"))
            if self.escalate_if is not None:
                object.__setattr__(self, "compiled_escalate", compile_predicate(self.escalate_if, "escalate_if"))
        except PredicateError as e:
            raise ValueError(str(e)) from None
        object.__setattr__(self, "range", VersionRange(self.versions))
        reads = referenced_fields(self.when) | referenced_fields(self.escalate_if) | ({"patches"} if self.patches else set())
        object.__setattr__(self, "reads", frozenset(reads))
        object.__setattr__(self, "mitigation_patch", SpecPatch.of(self.mitigation) if self.mitigation else None)
        if self.action == "warn" and not self.advisory_reason:
            raise ValueError("a warn-only rule needs advisory_reason (why it is not enforced)")
        if self.action == "enforce" and (self.escalate_if is not None or self.advisory_reason):
            raise ValueError("escalate_if / advisory_reason only make sense with action: warn")
        if self.fixed_in is not None and self.range.contains(parse_version(self.fixed_in)):
            raise ValueError(f"fixed_in {self.fixed_in} lies inside versions {self.versions!r}")
        if (self.ends_in is None) != (self.ends_why is None):
            raise ValueError("ends_in and ends_why go together (the release and what was removed in it)")
        if self.ends_in is not None:
            if self.fixed_in is not None:
                raise ValueError("a rule is either fixed (fixed_in) or ends with what it needs (ends_in), not both")
            if self.range.contains(parse_version(self.ends_in)) or self.range.is_open_ended:
                raise ValueError(f"ends_in {self.ends_in} must bound versions {self.versions!r} from above")
        for i, c in enumerate(self.cost):
            why = _cost_holds_mitigation(c, self.mitigation)
            if why:
                raise ValueError(f"cost[{i}]: {why}")
        return self

    @property
    def references(self) -> list[str]:
        return [self.id, *self.aliases]


#: spec path -> the effective field it sets on its own (cudagraphMode -> cudagraph_mode), for `cost` checks
_FIELD_OF_PATH = {
    path[len("spec.") :]: name
    for name, path in FIELDS.items()
    if sum(1 for p in FIELDS.values() if p == path) == 1 and path.startswith("spec.")
}


def _cost_holds_mitigation(cost: Cost, mitigation: dict[str, Any] | None) -> str:
    """Why a cost entry does not measure the rule's mitigation ('' when it does)."""
    if not mitigation:
        return "a cost is what a rule's mitigation costs: the rule has no mitigation"
    for path, value in mitigation.items():
        name = _FIELD_OF_PATH.get(path)
        if name is None:
            return f"mitigation {path} has no effective field of its own to compare in `config`"
        if cost.config.get(name) != value:
            return f"config.{name} must be the mitigation's value {value!r} (the measured engine ran with it)"
    return ""


class Builtin(_Strict):
    id: str
    title: str
    kind: RuleKind
    severity: Severity
    action: Literal["enforce", "warn", "advisory"]  # advisory: reported in its own list, not as a warning
    fields: list[str]
    workaround: str


class CatalogueInfo(_Strict):
    source: str
    oldest: str
    newest: str
    releases: list[str]

    @field_validator("oldest", "newest")
    @classmethod
    def _ver(cls, v: str) -> str:
        if parse_version(v) is None:
            raise ValueError(f"{v!r} is not a version")
        return v


_BUILTIN_KEYS = (
    "unparseable-version",
    "newer-than-catalogue",
    "older-than-catalogue",
    "unrecognised-architecture",
    "unknown-patch",
)


class RuleFile(_Strict):
    schema_: Literal[1] = Field(alias="schema")
    catalogue: CatalogueInfo
    patches: dict[str, str]
    planned_patches: dict[str, str] = Field(default_factory=dict)
    builtin: dict[str, Builtin]
    rules: list[Rule] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross(self) -> RuleFile:
        problems = []
        seen: dict[str, str] = {}
        for r in self.rules:
            for ref in r.references:
                if ref in seen:
                    problems.append(f"rule {r.id}: reference {ref} already used by {seen[ref]}")
                seen[ref] = r.id
            for p in r.patches:
                if p not in self.patches and p not in self.planned_patches:
                    problems.append(f"rule {r.id}: patch id {p} is not declared in `patches`")
        for p in set(self.patches) & set(self.planned_patches):
            problems.append(f"planned_patches: {p} is also in `patches` (shipped); keep it in one place")
        for key in _BUILTIN_KEYS:
            if key not in self.builtin:
                problems.append(f"builtin: missing {key}")
        for p in [*self.patches, *self.planned_patches]:
            if not _PATCH_RE.match(p):
                problems.append(f"patches: id {p!r} must look like gdn-guard/vllm-36917")
        if problems:
            raise ValueError("; ".join(problems))
        return self


_IN_RANGE_MAX = 256


class RuleSet:
    """The loaded rule file: rules in file order, patch ids, built-in finding texts, catalogue range."""

    def __init__(self, data: RuleFile, source: str):
        self.source = source
        self.data = data
        self.rules: tuple[Rule, ...] = tuple(data.rules)
        self.by_ref: dict[str, Rule] = {ref: r for r in self.rules for ref in r.references}
        self.order: dict[str, int] = {r.id: i for i, r in enumerate(self.rules)}
        #: rules whose mitigation has measured costs (rules/cost.py)
        self.costed: tuple[Rule, ...] = tuple(r for r in self.rules if r.cost)
        #: every effective value some rule reads (rules.matching.rematch compares only these)
        self.reads: frozenset[str] = frozenset().union(*(r.reads for r in self.rules))
        #: shipped patch ids: only these neutralise a rule
        self.patch_ids: dict[str, str] = dict(data.patches)
        #: planned patch ids: documented, never relied on
        self.planned_patch_ids: dict[str, str] = dict(data.planned_patches)
        #: per rule (file order): the shipped patch ids among those that neutralise it (matching's first test)
        self.shipped_patches: tuple[frozenset[str], ...] = tuple(
            frozenset(p for p in r.patches if p in self.patch_ids) for r in self.rules
        )
        self.builtin: dict[str, Builtin] = dict(data.builtin)
        self.oldest: Version = parse_version(data.catalogue.oldest)  # type: ignore[assignment]
        self.newest: Version = parse_version(data.catalogue.newest)  # type: ignore[assignment]
        self.releases: tuple[str, ...] = tuple(data.catalogue.releases)
        self._release_bases = frozenset(require_version(r).base for r in self.releases)
        #: version key -> indices of the rules whose `versions` hold it (matching asks per configuration; the
        #: versions a cluster runs are few, a bound keeps odd input from growing it)
        self._in_range: dict[VersionKey, tuple[int, ...]] = {}

    def in_range(self, key: VersionKey) -> tuple[int, ...]:
        """Indices (file order) of the rules whose affected versions hold the version with sort key `key`."""
        got = self._in_range.get(key)
        if got is None:
            got = tuple(i for i, r in enumerate(self.rules) if r.range.contains_key(key))
            if len(self._in_range) >= _IN_RANGE_MAX:
                self._in_range.clear()
            self._in_range[key] = got
        return got

    def rule(self, ref: str) -> Rule | None:
        """A rule by id or alias (e.g. 'vllm#53912' finds vllm#43559)."""
        return self.by_ref.get(ref)

    def uncatalogued(self, version: str | None) -> str | None:
        """Why `version` is not a release the catalogue read (None: it is one). A pre-release or nightly of a read
        release is not that release; a local build label (+cu129) is. `gdnctl validate --strict` refuses these."""
        ver = parse_version(version)
        if ver is None:
            return f"{version!r} is not a vLLM version"
        if ver.is_prerelease:
            return f"vLLM {ver} is a pre-release or nightly; the catalogue read releases only (newest {self.newest})"
        if ver.base not in self._release_bases:
            where = "newer than" if ver > self.newest else ("older than" if ver < self.oldest else "not among")
            return f"vLLM {ver.base} is {where} the releases the catalogue read ({self.oldest} - {self.newest})"
        return None

    def unchecked(self, version: Version) -> str:
        """What was not checked for `version`, a release newer than the newest one read: the newest release's
        rules and defaults are what the evaluation used instead."""
        open_bugs = [
            r.id
            for r in self.rules
            if r.range.is_open_ended and r.range.contains(self.newest) and not r.id.startswith("vllm-config/")
        ]
        tables = sorted(
            (v for v in (parse_version(t) for t in table_versions()) if v is not None and v <= version), key=lambda v: v.key
        )
        table = f"the vLLM {tables[-1]} option table" if tables else "no option table"
        return (
            f"not checked against vLLM {version}: which of the {len(open_bugs)} open bugs it fixes (assumed present: "
            f"{', '.join(open_bugs)}); the defaults the rules resolve (async scheduling, prefix caching, model "
            f"runner, CUDA graphs, KV-cache sizing: those of {self.newest} assumed); its CLI options (extraArgs read "
            f"with {table}) and the environment variables it validates; the crash signatures and metric names "
            f"(those of {self.newest})"
        )


def parse_rule_file(text: str, source: str = "rules.yaml") -> RuleSet:
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as e:
        raise RuleFileError([f"{source}: malformed YAML: {e}"]) from None
    if not isinstance(raw, dict):
        raise RuleFileError([f"{source}: expected a mapping at the top level"])
    try:
        data = RuleFile.model_validate(raw)
    except ValidationError as e:
        problems = []
        raw_rules = raw.get("rules")
        rules: list[Any] = raw_rules if isinstance(raw_rules, list) else []
        for err in e.errors(include_url=False):
            loc = list(err.get("loc", ()))
            where = ".".join(str(p) for p in loc)
            if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int) and loc[1] < len(rules):
                rid = rules[loc[1]].get("id") if isinstance(rules[loc[1]], dict) else None
                if rid:
                    where = f"rules[{loc[1]}] ({rid})" + ("." + ".".join(str(p) for p in loc[2:]) if loc[2:] else "")
            msg = err.get("msg", "invalid")
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            problems.append(f"{source}: {where or '(file)'}: {msg}")
        raise RuleFileError(problems) from None
    return RuleSet(data, source)


def default_rule_file() -> Path:
    return Path(str(resources.files("gdn_operator.rules") / "data" / "rules.yaml"))


@once
def load_rules() -> RuleSet:
    """The packaged rule file, parsed and validated once per process."""
    path = default_rule_file()
    return parse_rule_file(path.read_text(encoding="utf-8"), str(path))
