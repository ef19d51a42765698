"""The crash-signature catalogue (data/signatures.yaml): schema, validation, compilation.

Besides the signatures, the catalogue holds
  * `facts`: log lines that reveal the server's configuration (model family, speculative decoding, GDN
    prefill backend, vLLM version); they are the log side of the evidence a signature needs before it may
    name an upstream issue (watch/evidence.py);
  * `classes`: generic crash classes a specific signature falls back to when that evidence is missing;
  * `end_markers`: lines that say a process is ending (a logged exception followed by one is a crash);
  * `actions`: what each remediation action changes in the spec (watch/remedies.py). A catalogue without
    its own `actions:` uses the packaged file's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.datafiles import load_yaml, once
from gdn_operator.versions import VersionRange
from gdn_operator.watch.remedies import Action, ActionError, action_patch, parse_actions

if TYPE_CHECKING:
    from gdn_operator.api.spec import GDNModelServerSpec

KINDS = ("runtime-crash", "startup-crash", "config-error", "oom", "deadlock", "generic")
CONFIDENCES = ("exact", "probable")
ROOT_CAUSE_MODES = ("match", "last-exception")
#: facts a signature's attribution may test, and the values each can take
FACTS = {
    "family": ("gdn-hybrid", "other"),
    "spec_decode": ("on", "off"),
    "gdn_prefill_backend": ("flashinfer", "triton", "other"),
}
#: Literals every exception line ("SomeError: msg") contains; part of the prefilter.
EXCEPTION_KEYWORDS = ("Error", "Exception", "Fault")
#: Literals of Python's chained-exception lines ("The above exception was the direct cause of the following
#: exception:", "During handling of the above exception, another exception occurred:"); part of the prefilter.
CHAIN_KEYWORDS = ("above exception",)
DEFAULT_REPOS = {"vllm": "vllm-project/vllm", "flashinfer": "flashinfer-ai/flashinfer"}


class CatalogueError(ValueError):
    """The signature catalogue is malformed; the message names the file, entry and field."""


DEFAULT_CATALOGUE_PATH = "data/signatures.yaml"


@once
def _packaged() -> tuple[str, Any]:
    """(where, parsed YAML) of the packaged catalogue, read once."""
    ref = resources.files("gdn_operator.watch").joinpath(DEFAULT_CATALOGUE_PATH)
    where = str(ref)
    try:
        return where, load_yaml(ref.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise CatalogueError(f"{where}: not valid YAML: {e}") from None


@once
def packaged_actions() -> dict[str, Action]:
    """The packaged catalogue's `actions:` table (what each remediation action changes in the spec)."""
    where, data = _packaged()
    try:
        return parse_actions(where, data.get("actions") if isinstance(data, dict) else None)
    except ActionError as e:
        raise CatalogueError(str(e)) from None


#: Remediation action ids (the packaged `actions:` table; data/signatures.yaml defines them).
ACTIONS: tuple[str, ...] = tuple(packaged_actions())


@dataclass(frozen=True)
class LadderStep:
    """One setting to try, in order, before the signature's last-resort action (issue 18)."""

    action: str
    reason: str
    min_tp: int = 1  # the step applies only from this tensorParallelSize


@dataclass(frozen=True)
class Remedy:
    """What the catalogue says to do about a signature (what the operator then did is status.remediations,
    api/status.py Remediation)."""

    action: str
    hint: str
    #: settings that keep speculative decoding on, tried in order (each once) before `action`
    ladder: tuple[LadderStep, ...] = ()


@dataclass(frozen=True)
class Alternative:
    """All `patterns` must match lines lying within `window` lines of each other (one pattern: one line)."""

    patterns: tuple[re.Pattern[str], ...]
    window: int
    confidence: str | None = None  # overrides the signature's (e.g. a frame alone: probable)


@dataclass(frozen=True)
class Attribution:
    """What must be known before a signature may name its upstream issue."""

    needs: tuple[tuple[str, str], ...] = ()  # every fact must be known to have this value
    excludes: tuple[tuple[str, str], ...] = ()  # no fact may be known to have this value
    versions: VersionRange | None = None  # affected releases; a known version outside them disqualifies


@dataclass(frozen=True)
class CrashClass:
    id: str
    title: str
    kind: str
    hint: str


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    kind: str
    upstream: str | None
    related: tuple[str, ...]
    bugs: tuple[str, ...]
    priority: int
    generic: bool
    confidence: str
    keywords: tuple[str, ...]
    alternatives: tuple[Alternative, ...]
    remediation: Remedy
    root_cause: str = "match"
    unlevelled_only: bool = False
    exclude_secondary: bool = False
    unless: tuple[re.Pattern[str], ...] = ()
    unless_window: int = 0
    source: str = ""
    examples: tuple[str, ...] = ()
    near_misses: tuple[str, ...] = ()
    attribution: Attribution | None = None
    parent: str | None = None  # signature or class reported instead when attribution fails


@dataclass(frozen=True)
class FactRule:
    fact: str
    value: str | None  # None: the value is the pattern's first group (vllm_version)
    keywords: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]


@dataclass(frozen=True)
class Catalogue:
    signatures: tuple[Signature, ...]
    secondary: re.Pattern[str]
    repos: dict[str, str]
    path: str
    #: minimal set of literals: a raw line containing none of them cannot match anything
    scan_keywords: tuple[str, ...]
    #: the prefilter: finds a piece of every scan keyword (a superset of the lines holding one)
    scan_regex: re.Pattern[str]
    facts: tuple[FactRule, ...] = ()
    classes: dict[str, CrashClass] = field(default_factory=dict)
    end_keywords: tuple[str, ...] = ()
    end_regex: re.Pattern[str] = re.compile(r"(?!)")
    #: the prefilter without the fact keywords (once the facts are known, or the startup is over)
    steady_regex: re.Pattern[str] = re.compile(r"(?!)")
    #: remediation action id → the spec change it makes (`actions:`)
    actions: dict[str, Action] = field(default_factory=dict)

    def remedy_patch(self, action: str, spec: GDNModelServerSpec) -> SpecPatch | None:
        """The spec change remediation `action` makes to `spec`: None when it needs a human, does not
        apply to this spec, or is already in effect (so it is never applied twice)."""
        return action_patch(self.actions.get(action), spec)

    def get(self, sig_id: str) -> Signature:
        for s in self.signatures:
            if s.id == sig_id:
                return s
        raise KeyError(sig_id)

    def upstream_url(self, ref: str | None) -> str | None:
        if not ref or "#" not in ref:
            return None
        repo, _, num = ref.partition("#")
        full = self.repos.get(repo, repo if "/" in repo else None)
        if not full or not num.isdigit():
            return None
        return f"https://github.com/{full}/issues/{num}"


def _compile(where: str, rx: Any) -> re.Pattern[str]:
    if not isinstance(rx, str) or not rx:
        raise CatalogueError(f"{where}: expected a non-empty regex string, got {rx!r}")
    try:
        return re.compile(rx)
    except re.error as e:
        raise CatalogueError(f"{where}: invalid regex {rx!r}: {e}") from None


def _str_list(where: str, v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise CatalogueError(f"{where}: expected a list of strings")
    return tuple(v)


def _minimal_keywords(words: Iterable[str]) -> tuple[str, ...]:
    """Drop keywords that contain another keyword (the shorter one already finds the line)."""
    uniq = sorted(set(words), key=len)
    out: list[str] = []
    for w in uniq:
        if not any(o in w for o in out):
            out.append(w)
    return tuple(out)


# Printable ASCII from most to least frequent in vLLM serving logs (measured once on the real 0.32.0
# startup log followed by steady-state serving lines). Used only to choose which 4-character piece of each
# keyword the prefilter regex looks for: pieces starting with a rare character let the regex engine skip
# ahead faster. The choice never changes results, only speed.
_COMMON_CHARS = " 10./OT2:P\"esotnc34p5vI-SNFKH6i879mlrahg,udAkfD%q=y([])REWGMxUV_B'bwzC`L^{}j><J;QY"
_CHAR_RANK = {c: len(_COMMON_CHARS) - i for i, c in enumerate(_COMMON_CHARS)}
_PIECE = 4


def _rare_piece(keyword: str) -> str:
    """The _PIECE-character substring of keyword that starts with its least common character."""
    if len(keyword) <= _PIECE:
        return keyword
    best = min(range(len(keyword) - _PIECE + 1), key=lambda i: (_CHAR_RANK.get(keyword[i], 0), i))
    return keyword[best : best + _PIECE]


def _fact_pairs(where: str, v: Any) -> tuple[tuple[str, str], ...]:
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise CatalogueError(f"{where}: expected a mapping of fact: value")
    out = []
    for k, val in v.items():
        if k not in FACTS or val not in FACTS[k]:
            allowed = "; ".join(f"{f}: {'|'.join(vs)}" for f, vs in FACTS.items())
            raise CatalogueError(f"{where}: unknown fact or value {k}: {val!r} (allowed: {allowed})")
        out.append((k, val))
    return tuple(out)


def _parse_attribution(where: str, a: Any) -> Attribution | None:
    if a is None:
        return None
    if not isinstance(a, dict):
        raise CatalogueError(f"{where}: field 'attribution' must be a mapping (needs / excludes / versions)")
    versions = None
    if a.get("versions") is not None:
        try:
            versions = VersionRange(str(a["versions"]))
        except ValueError as e:
            raise CatalogueError(f"{where}: attribution.versions: {e}") from None
    return Attribution(
        _fact_pairs(f"{where}: attribution.needs", a.get("needs")),
        _fact_pairs(f"{where}: attribution.excludes", a.get("excludes")),
        versions,
    )


def _parse_facts(path: str, data: Any) -> tuple[FactRule, ...]:
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise CatalogueError(f"{path}: field 'facts' must be a mapping fact -> value -> {{keywords, patterns}}")
    rules = []
    for fact, values in data.items():
        if fact not in FACTS and fact != "vllm_version":
            raise CatalogueError(f"{path}: facts: unknown fact {fact!r}")
        if not isinstance(values, dict):
            raise CatalogueError(f"{path}: facts.{fact}: expected a mapping value -> {{keywords, patterns}}")
        for value, spec in values.items():
            where = f"{path}: facts.{fact}.{value}"
            if fact != "vllm_version" and value not in FACTS[fact]:
                raise CatalogueError(f"{where}: value must be one of {', '.join(FACTS[fact])}")
            if not isinstance(spec, dict):
                raise CatalogueError(f"{where}: expected a mapping with 'keywords' and 'patterns'")
            kws = _str_list(f"{where}.keywords", spec.get("keywords"))
            pats = tuple(
                _compile(f"{where}.patterns[{i}]", p) for i, p in enumerate(_str_list(f"{where}.patterns", spec.get("patterns")))
            )
            if not kws or not pats:
                raise CatalogueError(f"{where}: needs at least one keyword and one pattern")
            rules.append(FactRule(fact, None if fact == "vllm_version" else value, kws, pats))
    return tuple(rules)


def _parse_signature(where: str, s: dict[str, Any], sid: str, actions: dict[str, Action]) -> Signature:
    for fld in ("title",):
        if not isinstance(s.get(fld), str) or not s[fld].strip():
            raise CatalogueError(f"{where}: field '{fld}' must be a non-empty string")
    kind = s.get("kind")
    if kind not in KINDS:
        raise CatalogueError(f"{where}: field 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    upstream = s.get("upstream")
    if upstream is not None and (not isinstance(upstream, str) or "#" not in upstream):
        raise CatalogueError(f"{where}: field 'upstream' must be null or 'repo#number', got {upstream!r}")
    prio = s.get("priority")
    if not isinstance(prio, int) or isinstance(prio, bool):
        raise CatalogueError(f"{where}: field 'priority' must be an integer")
    confidence = s.get("confidence", "exact")
    if confidence not in CONFIDENCES:
        raise CatalogueError(f"{where}: field 'confidence' must be one of {', '.join(CONFIDENCES)}")
    root_mode = s.get("root_cause", "last-exception" if s.get("generic") and sid == "engine-dead" else "match")
    if root_mode not in ROOT_CAUSE_MODES:
        raise CatalogueError(f"{where}: field 'root_cause' must be one of {', '.join(ROOT_CAUSE_MODES)}")
    keywords = _str_list(f"{where}: keywords", s.get("keywords"))
    if not keywords or any(not k for k in keywords):
        raise CatalogueError(f"{where}: field 'keywords' must list at least one non-empty literal")
    rem = s.get("remediation")
    if not isinstance(rem, dict) or rem.get("action") not in actions or not isinstance(rem.get("hint"), str):
        raise CatalogueError(f"{where}: field 'remediation' needs 'action' (one of {', '.join(actions)}) and a 'hint' string")
    ladder: list[LadderStep] = []
    for k, step in enumerate(rem.get("ladder") or []):
        lw = f"{where}: remediation.ladder[{k}]"
        if not isinstance(step, dict) or step.get("action") not in actions or not isinstance(step.get("reason"), str):
            raise CatalogueError(f"{lw}: needs 'action' (one of {', '.join(actions)}) and a 'reason' string")
        min_tp = step.get("min_tp", 1)
        if not isinstance(min_tp, int) or isinstance(min_tp, bool) or min_tp < 1:
            raise CatalogueError(f"{lw}: 'min_tp' must be a positive integer")
        ladder.append(LadderStep(step["action"], " ".join(step["reason"].split()), min_tp))
    match = s.get("match")
    if not isinstance(match, list) or not match:
        raise CatalogueError(f"{where}: field 'match' must be a non-empty list")
    alts: list[Alternative] = []
    for j, alt in enumerate(match):
        aw = f"{where}: match[{j}]"
        if isinstance(alt, str):
            alts.append(Alternative((_compile(aw, alt),), 0))
        elif isinstance(alt, dict):
            pats = alt.get("all")
            window = alt.get("window")
            conf = alt.get("confidence")
            if not isinstance(pats, list) or len(pats) < 2:
                raise CatalogueError(f"{aw}: 'all' must list at least two regexes")
            if not isinstance(window, int) or isinstance(window, bool) or window < 0:
                raise CatalogueError(f"{aw}: 'window' must be a non-negative integer (lines)")
            if conf is not None and conf not in CONFIDENCES:
                raise CatalogueError(f"{aw}: 'confidence' must be one of {', '.join(CONFIDENCES)}")
            alts.append(Alternative(tuple(_compile(f"{aw}.all[{k}]", p) for k, p in enumerate(pats)), window, conf))
        else:
            raise CatalogueError(f"{aw}: must be a regex string or a mapping with 'all' and 'window'")
    unless_pats: tuple[re.Pattern[str], ...] = ()
    unless_window = 0
    if s.get("unless") is not None:
        u = s["unless"]
        if not isinstance(u, dict):
            raise CatalogueError(f"{where}: field 'unless' must be a mapping with 'patterns' and 'window'")
        unless_pats = tuple(
            _compile(f"{where}: unless.patterns[{k}]", p)
            for k, p in enumerate(_str_list(f"{where}: unless.patterns", u.get("patterns")))
        )
        unless_window = u.get("window", 0)
        if not isinstance(unless_window, int) or unless_window < 0:
            raise CatalogueError(f"{where}: field 'unless.window' must be a non-negative integer")
    attribution = _parse_attribution(where, s.get("attribution"))
    parent = s.get("parent")
    if attribution is not None and (upstream is None or not isinstance(parent, str)):
        raise CatalogueError(f"{where}: 'attribution' needs an 'upstream' and a 'parent' (the class reported without evidence)")
    return Signature(
        id=sid,
        title=s["title"].strip(),
        kind=kind,
        upstream=upstream,
        related=_str_list(f"{where}: related", s.get("related")),
        bugs=_str_list(f"{where}: bugs", s.get("bugs")),
        priority=prio,
        generic=bool(s.get("generic", False)),
        confidence=confidence,
        keywords=keywords,
        alternatives=tuple(alts),
        remediation=Remedy(rem["action"], " ".join(rem["hint"].split()), tuple(ladder)),
        root_cause=root_mode,
        unlevelled_only=bool(s.get("unlevelled_only", False)),
        exclude_secondary=bool(s.get("exclude_secondary", False)),
        unless=unless_pats,
        unless_window=unless_window,
        source=str(s.get("source", "")),
        examples=_str_list(f"{where}: examples", s.get("examples")),
        near_misses=_str_list(f"{where}: near_misses", s.get("near_misses")),
        attribution=attribution,
        parent=parent if isinstance(parent, str) else None,
    )


def parse_catalogue(data: Any, path: str = "<catalogue>") -> Catalogue:
    """Validate and compile a loaded catalogue document. Raises CatalogueError naming the bad field."""
    if not isinstance(data, dict):
        raise CatalogueError(f"{path}: top level must be a mapping with 'signatures'")
    if data.get("schema") != 1:
        raise CatalogueError(f"{path}: field 'schema' must be 1, got {data.get('schema')!r}")
    raw_sigs = data.get("signatures")
    if not isinstance(raw_sigs, list) or not raw_sigs:
        raise CatalogueError(f"{path}: field 'signatures' must be a non-empty list")
    secondary_src = _str_list(f"{path}: secondary_exceptions", data.get("secondary_exceptions"))
    for i, rx in enumerate(secondary_src):
        _compile(f"{path}: secondary_exceptions[{i}]", rx)
    secondary = re.compile("|".join(f"(?:{rx})" for rx in secondary_src) or r"(?!)")
    repos = dict(DEFAULT_REPOS)
    if isinstance(data.get("repos"), dict):
        repos.update({str(k): str(v) for k, v in data["repos"].items()})

    if data.get("actions") is None:
        actions = packaged_actions()
    else:
        try:
            actions = parse_actions(path, data["actions"])
        except ActionError as e:
            raise CatalogueError(str(e)) from None

    classes: dict[str, CrashClass] = {}
    raw_classes = data.get("classes") or {}
    if not isinstance(raw_classes, dict):
        raise CatalogueError(f"{path}: field 'classes' must be a mapping id -> {{title, kind, hint}}")
    for cid, c in raw_classes.items():
        if not isinstance(c, dict) or not isinstance(c.get("title"), str) or c.get("kind") not in KINDS:
            raise CatalogueError(f"{path}: classes.{cid}: needs 'title' and 'kind' (one of {', '.join(KINDS)})")
        classes[cid] = CrashClass(cid, c["title"], c["kind"], " ".join(str(c.get("hint", "")).split()))

    sigs: list[Signature] = []
    seen: set[str] = set()
    for i, s in enumerate(raw_sigs):
        where = f"{path}: signatures[{i}]"
        if not isinstance(s, dict):
            raise CatalogueError(f"{where}: must be a mapping")
        sid = s.get("id")
        if not isinstance(sid, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", sid):
            raise CatalogueError(f"{where}: field 'id' must be a lower-case slug, got {sid!r}")
        where = f"{path}: signature {sid!r}"
        if sid in seen:
            raise CatalogueError(f"{where}: duplicate id")
        seen.add(sid)
        sigs.append(_parse_signature(where, s, sid, actions))
    for sig in sigs:
        if sig.parent is not None and sig.parent not in seen and sig.parent not in classes:
            raise CatalogueError(f"{path}: signature {sig.id!r}: parent {sig.parent!r} is neither a signature nor a class")

    facts = _parse_facts(path, data.get("facts"))
    end_src = data.get("end_markers") or {}
    end_kw = _str_list(f"{path}: end_markers.keywords", end_src.get("keywords")) if isinstance(end_src, dict) else ()
    end_pats = _str_list(f"{path}: end_markers.patterns", end_src.get("patterns")) if isinstance(end_src, dict) else ()
    for i, rx in enumerate(end_pats):
        _compile(f"{path}: end_markers.patterns[{i}]", rx)
    end_rx = re.compile("|".join(f"(?:{rx})" for rx in end_pats) or r"(?!)")

    steady = [k for s in sigs for k in s.keywords] + list(end_kw) + list(EXCEPTION_KEYWORDS) + list(CHAIN_KEYWORDS)
    scan = _minimal_keywords(steady + [k for f in facts for k in f.keywords])
    return Catalogue(
        tuple(sigs),
        secondary,
        repos,
        path,
        scan,
        _prefilter(scan),
        facts,
        classes,
        end_kw,
        end_rx,
        _prefilter(_minimal_keywords(steady)),
        dict(actions),
    )


def _prefilter(keywords: Iterable[str]) -> re.Pattern[str]:
    pieces = _minimal_keywords(_rare_piece(k) for k in keywords)
    return re.compile("|".join(re.escape(p) for p in sorted(pieces)))


def load_catalogue(path: str | Path | None = None) -> Catalogue:
    """Load a catalogue file (default: the packaged data/signatures.yaml)."""
    if path is None:
        where, packaged = _packaged()
        return parse_catalogue(packaged, where)
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogueError(f"{where}: cannot read catalogue: {e.strerror or e}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise CatalogueError(f"{where}: not valid YAML: {e}") from None
    return parse_catalogue(data, where)


@once
def default_catalogue() -> Catalogue:
    return load_catalogue()
