"""Crash-signature catalogue (data/signatures.yaml) and the log classifier built on it.

The catalogue is data: regexes over vLLM log lines and termination messages, each tied to an upstream
issue (vllm#36917, vllm#41190, ...) and a remediation hint. This module loads and validates it and
classifies text:

    classify_text(text) -> ClassificationResult        one-shot, whole log or termination message
    classify_termination_message(text)                  same, for a container's termination message
    LogClassifier().feed_line(line) / .feed_text(text)  incremental core (logstream.py wraps it for bytes)

Matching runs on the payload of each line, after stripping kubelet CRI / `--timestamps` timestamps,
ANSI colour codes, docker-compose prefixes, vLLM multi-process prefixes `(Worker_TP4 pid=826)`, vLLM
logger headers `ERROR 11-12 10:00:01 [multiproc_executor.py:880]`, glog/c10 headers and uvicorn levels.
Lines at DEBUG/INFO/WARNING never trigger a signature (vLLM logs handled exceptions as WARNING tracebacks
in healthy runs).

Speed: a raw line is only looked at further when it contains a 4-character piece of one of the
catalogue's literal keywords; one precompiled regex scans whole blocks of text for those pieces, so the
noise lines never reach Python code (bench/bench_classifier.py).
"""

from __future__ import annotations

import functools
import json
import re
from collections import deque
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

KINDS = ("runtime-crash", "startup-crash", "config-error", "oom", "deadlock", "generic")
ACTIONS = (
    "disable-spec-decode",
    "disable-async-scheduling",
    "patched-image",
    "lower-num-speculative-tokens",
    "gdn-prefill-backend-triton",
    "disable-v2-model-runner",
    "enable-chunked-prefill",
    "disable-prefix-caching",
    "raise-max-num-batched-tokens",
    "reduce-memory",
    "investigate",
)
CONFIDENCES = ("exact", "probable")
ROOT_CAUSE_MODES = ("match", "last-exception")

#: Lines are cut to this many characters before matching (bounded work and memory per line).
MAX_LINE_CHARS = 8192
#: Lines of context (the traceback tail) kept with a result.
CONTEXT_LINES = 20
#: Characters kept per context line.
CONTEXT_LINE_CHARS = 512
#: An exception line further than this many lines above an engine-death marker is not its root cause.
ROOT_CAUSE_MAX_DISTANCE = 2000

NOISE_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})
#: Literals every exception line ("SomeError: msg") contains; part of the prefilter.
EXCEPTION_KEYWORDS = ("Error", "Exception", "Fault")

_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Fault)\b(?::\s|:?$)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CRI = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s(?:(?:stdout|stderr)\s[FP]\s)?"
)
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]{0,62}\s+\|\s")
_PROC = re.compile(r"^\([^()\s]{1,80}(?: [^()]{0,80}?)? ?pid=\d+[^()]{0,80}\)\s?")
_HDR = re.compile(
    r"^(?:(?P<v>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+ \[[^\]]{0,120}\] ?"
    r"|(?:\[rank\d+\]:)?\[(?P<g>[DIWEF])\d{3,4} [\d:.]+ [^\]]{0,120}\] ?"
    r"|(?P<u>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+)"
)
_GLOG_LEVELS = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}

DEFAULT_REPOS = {"vllm": "vllm-project/vllm", "flashinfer": "flashinfer-ai/flashinfer"}


class CatalogueError(ValueError):
    """The signature catalogue is malformed; the message names the file, entry and field."""


def strip_prefixes(line: str) -> tuple[str | None, str]:
    """Return (level or None, payload) of one raw log line.

    Removes ANSI codes, a CRI / RFC3339 timestamp (`2026-11-22T13:16:43.1Z stderr F `), a docker-compose
    `svc  | ` prefix, a vLLM process prefix `(EngineCore_DP0 pid=123) `, and a logger header (vLLM
    `ERROR 11-12 10:00:01 [core.py:1100] `, glog `[rank0]:[E1122 13:17:04.1 ProcessGroupNCCL.cpp:1] `,
    uvicorn `ERROR:    `). Trailing whitespace (including the CR of CRLF logs) is dropped.
    """
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = line.rstrip()
    if not line:
        return None, line
    c = line[0]
    if c.isdigit():
        m = _CRI.match(line)
        if m:
            line = line[m.end() :]
    if line[:1].isalnum() and "|" in line[:80]:
        m = _COMPOSE.match(line)
        if m:
            line = line[m.end() :]
    if line[:1] == "(":
        m = _PROC.match(line)
        if m:
            line = line[m.end() :]
    level = None
    c = line[:1]
    if c in "DIWEC[":
        m = _HDR.match(line)
        if m:
            if m.group("v"):
                level = m.group("v")
            elif m.group("g"):
                level = _GLOG_LEVELS[m.group("g")]
            else:
                level = m.group("u")
            line = line[m.end() :]
    return level, line


def is_exception_line(payload: str) -> bool:
    """True for a Python exception line such as `ValueError: msg` or a bare `AssertionError`."""
    return _EXC_LINE.match(payload) is not None


# ------------------------------------------------------------------------------------------------
# catalogue


@dataclass(frozen=True)
class Remediation:
    action: str
    hint: str


@dataclass(frozen=True)
class Alternative:
    """All `patterns` must match lines lying within `window` lines of each other (one pattern: one line)."""

    patterns: tuple[re.Pattern[str], ...]
    window: int


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
    remediation: Remediation
    root_cause: str = "match"
    unlevelled_only: bool = False
    exclude_secondary: bool = False
    unless: tuple[re.Pattern[str], ...] = ()
    unless_window: int = 0
    source: str = ""
    examples: tuple[str, ...] = ()
    near_misses: tuple[str, ...] = ()


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
_COMMON_CHARS = ' 10./OT2:P"esotnc34p5vI-SNFKH6i879mlrahg,udAkfD%q=y([])REWGMxUV_B\'bwzC`L^{}j><J;QY'
_CHAR_RANK = {c: len(_COMMON_CHARS) - i for i, c in enumerate(_COMMON_CHARS)}
_PIECE = 4


def _rare_piece(keyword: str) -> str:
    """The _PIECE-character substring of keyword that starts with its least common character."""
    if len(keyword) <= _PIECE:
        return keyword
    best = min(range(len(keyword) - _PIECE + 1), key=lambda i: (_CHAR_RANK.get(keyword[i], 0), i))
    return keyword[best : best + _PIECE]


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
        if not isinstance(rem, dict) or rem.get("action") not in ACTIONS or not isinstance(rem.get("hint"), str):
            raise CatalogueError(
                f"{where}: field 'remediation' needs 'action' (one of {', '.join(ACTIONS)}) and a 'hint' string"
            )
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
                if not isinstance(pats, list) or len(pats) < 2:
                    raise CatalogueError(f"{aw}: 'all' must list at least two regexes")
                if not isinstance(window, int) or isinstance(window, bool) or window < 0:
                    raise CatalogueError(f"{aw}: 'window' must be a non-negative integer (lines)")
                alts.append(Alternative(tuple(_compile(f"{aw}.all[{k}]", p) for k, p in enumerate(pats)), window))
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
        sigs.append(
            Signature(
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
                remediation=Remediation(rem["action"], " ".join(rem["hint"].split())),
                root_cause=root_mode,
                unlevelled_only=bool(s.get("unlevelled_only", False)),
                exclude_secondary=bool(s.get("exclude_secondary", False)),
                unless=unless_pats,
                unless_window=unless_window,
                source=str(s.get("source", "")),
                examples=_str_list(f"{where}: examples", s.get("examples")),
                near_misses=_str_list(f"{where}: near_misses", s.get("near_misses")),
            )
        )
    scan = _minimal_keywords([k for s in sigs for k in s.keywords] + list(EXCEPTION_KEYWORDS))
    pieces = _minimal_keywords(_rare_piece(k) for k in scan)
    scan_rx = re.compile("|".join(re.escape(p) for p in sorted(pieces)))
    return Catalogue(tuple(sigs), secondary, repos, path, scan, scan_rx)


DEFAULT_CATALOGUE_PATH = "data/signatures.yaml"


def load_catalogue(path: str | Path | None = None) -> Catalogue:
    """Load a catalogue file (default: the packaged data/signatures.yaml)."""
    if path is None:
        ref = resources.files("gdn_operator.watch").joinpath(DEFAULT_CATALOGUE_PATH)
        text = ref.read_text(encoding="utf-8")
        where = str(ref)
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise CatalogueError(f"{where}: cannot read catalogue: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CatalogueError(f"{where}: not valid YAML: {e}") from None
    return parse_catalogue(data, where)


@functools.lru_cache(maxsize=1)
def default_catalogue() -> Catalogue:
    return load_catalogue()


# ------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class MatchedLine:
    line: int
    text: str


@dataclass
class ClassificationResult:
    """What the crash watch knows about one log / termination message. JSON-serialisable via to_dict()."""

    crashed: bool
    signature: str | None = None
    title: str | None = None
    kind: str | None = None
    generic: bool = False
    confidence: str | None = None
    upstream: str | None = None
    upstream_url: str | None = None
    related: list[str] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    priority: int = 0
    root_cause: str | None = None
    root_cause_line: int | None = None
    matched: list[MatchedLine] = field(default_factory=list)
    remediation: Remediation | None = None
    other_signatures: list[str] = field(default_factory=list)
    context: list[str] = field(default_factory=list)
    lines_scanned: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def summary(self) -> str:
        """One line for a Kubernetes Event / status message."""
        if not self.crashed:
            return "no crash signature found"
        up = f" ({self.upstream})" if self.upstream else ""
        rc = f": {self.root_cause}" if self.root_cause else ""
        return f"{self.signature}{up}{rc}"


def best_result(*results: ClassificationResult | None) -> ClassificationResult:
    """The most informative of several results (e.g. termination message vs. streamed log).

    Crashed beats not crashed, specific beats generic, then higher priority, then a root cause present.
    """
    rs = [r for r in results if r is not None]
    if not rs:
        return ClassificationResult(crashed=False)
    return max(rs, key=lambda r: (r.crashed, not r.generic, r.priority, r.root_cause is not None))


# ------------------------------------------------------------------------------------------------
# classifier core


class _Fire:
    __slots__ = ("lineno", "root", "matched", "context")

    def __init__(self, lineno: int, root: tuple[int, str], matched: list[tuple[int, str]], context: list[str]):
        self.lineno = lineno
        self.root = root
        self.matched = matched
        self.context = context


class _SigState:
    __slots__ = ("sig", "last", "fire", "last_unless")

    def __init__(self, sig: Signature):
        self.sig = sig
        # per alternative, per pattern: (lineno, payload) of the last matching line
        self.last: list[list[tuple[int, str] | None]] = [[None] * len(a.patterns) for a in sig.alternatives]
        self.fire: _Fire | None = None
        self.last_unless = -(10**12)


def _cap(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n]


class LogClassifier:
    """Incremental classifier over complete log lines. Memory is bounded by the catalogue size.

    feed_line(line) for one line (no trailing newline); feed_text(text) for a block of complete lines
    (split on '\\n'; a final line without '\\n' counts as complete). result() can be called any time.
    """

    def __init__(self, catalogue: Catalogue | None = None, max_line_chars: int = MAX_LINE_CHARS):
        self.catalogue = catalogue or default_catalogue()
        self.max_line_chars = max_line_chars
        self._states = [_SigState(s) for s in self.catalogue.signatures]
        self._scan_rx = self.catalogue.scan_regex
        self._secondary = self.catalogue.secondary
        self._tail: deque[str] = deque(maxlen=CONTEXT_LINES)
        self._n = 0
        self._last_exc: tuple[int, str, list[str]] | None = None
        # engine-death root cause (root_cause: last-exception signatures)
        self._death_root: tuple[int, str, list[str]] | None = None

    # -- feeding --------------------------------------------------------------------------------
    @property
    def lines_scanned(self) -> int:
        return self._n

    def feed_line(self, line: str) -> None:
        if "\n" in line:
            self.feed_text(line)
            return
        line = _cap(line, self.max_line_chars)
        self._n += 1
        if self._scan_rx.search(line) is not None:
            tail = list(self._tail)
            self._process(line, self._n, lambda: tail)
        self._tail.append(_cap(line, CONTEXT_LINE_CHARS))

    def feed_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.feed_line(line)

    def feed_text(self, text: str) -> None:
        if not text:
            return
        if text.endswith("\n"):
            body_end = len(text) - 1
        else:
            body_end = len(text)
        # candidate lines: those holding a piece of a catalogue keyword (one C-level regex scan)
        search = self._scan_rx.search
        find = text.find
        base = self._n
        lineno = base
        last = 0
        cap = self.max_line_chars
        pos = 0
        while True:
            m = search(text, pos)
            if m is None:
                break
            p = m.start()
            ls = text.rfind("\n", 0, p) + 1
            le = find("\n", p)
            if le == -1:
                le = len(text)
            lineno += text.count("\n", last, ls)
            last = ls
            line = text[ls : min(le, ls + cap)]
            self._process(line, lineno + 1, functools.partial(self._context_in, text, ls))
            pos = le + 1
        self._n = base + text.count("\n", 0, body_end) + 1
        for ln in self._lines_before(text, body_end + 1, CONTEXT_LINES):
            self._tail.append(ln)

    # -- context helpers ------------------------------------------------------------------------
    @staticmethod
    def _lines_before(text: str, ls: int, k: int) -> list[str]:
        """Up to k lines of text ending just before offset ls (which is a line start), oldest first."""
        out: list[str] = []
        end = ls - 1  # index of the '\n' that ends the previous line
        while len(out) < k and end >= 0:
            start = text.rfind("\n", 0, end) + 1
            out.append(text[start : min(end, start + CONTEXT_LINE_CHARS)])
            end = start - 1
        out.reverse()
        return out

    def _context_in(self, text: str, ls: int) -> list[str]:
        lines = self._lines_before(text, ls, CONTEXT_LINES)
        if len(lines) < CONTEXT_LINES:
            need = CONTEXT_LINES - len(lines)
            lines = list(self._tail)[-need:] + lines
        return lines

    # -- matching -------------------------------------------------------------------------------
    def _process(self, line: str, lineno: int, ctx: Callable[[], list[str]]) -> None:
        level, payload = strip_prefixes(line)
        if not payload:
            return
        noisy = level in NOISE_LEVELS
        secondary: bool | None = None
        if not noisy and _EXC_LINE.match(payload):
            secondary = self._secondary.search(payload) is not None
            if not secondary:
                self._last_exc = (lineno, payload, ctx())
        for st in self._states:
            sig = st.sig
            for kw in sig.keywords:
                if kw in line:
                    break
            else:
                continue
            if sig.unless:
                for p in sig.unless:
                    if p.search(payload):
                        st.last_unless = lineno
                        break
            if noisy or (sig.unlevelled_only and level is not None):
                continue
            if sig.exclude_secondary:
                if secondary is None:
                    secondary = self._secondary.search(payload) is not None
                if secondary:
                    continue
            if st.fire is not None and sig.root_cause != "last-exception":
                continue
            for alt, last in zip(sig.alternatives, st.last):
                hit = False
                for i, p in enumerate(alt.patterns):
                    if p.search(payload):
                        last[i] = (lineno, payload)
                        hit = True
                if not hit:
                    continue
                if any(x is None for x in last):
                    continue
                lo = min(x[0] for x in last)  # type: ignore[index]
                if lineno - lo > alt.window:
                    continue
                if sig.unless and lineno - st.last_unless <= sig.unless_window + (lineno - lo):
                    continue
                self._fire(st, lineno, payload, last, ctx)  # type: ignore[arg-type]
                break

    def _fire(
        self,
        st: _SigState,
        lineno: int,
        payload: str,
        last: list[tuple[int, str]],
        ctx: Callable[[], list[str]],
    ) -> None:
        sig = st.sig
        if sig.root_cause == "last-exception":
            le = self._last_exc
            if le is not None and 0 <= lineno - le[0] <= ROOT_CAUSE_MAX_DISTANCE:
                self._death_root = le
            elif self._death_root is None:
                self._death_root = (lineno, payload, ctx())
            if st.fire is not None:
                return
        matched = sorted(set(last))
        st.fire = _Fire(lineno, last[0], matched, ctx() + [_cap(payload, CONTEXT_LINE_CHARS)])

    # -- result ---------------------------------------------------------------------------------
    @property
    def crashed(self) -> bool:
        return any(st.fire is not None for st in self._states)

    def result(self) -> ClassificationResult:
        fired = [st for st in self._states if st.fire is not None]
        if not fired:
            return ClassificationResult(crashed=False, lines_scanned=self._n)
        specific = [st for st in fired if not st.sig.generic]
        pool = specific or fired
        best = max(pool, key=lambda st: (st.sig.priority, -st.fire.lineno))  # type: ignore[union-attr]
        fire = best.fire
        assert fire is not None
        sig = best.sig
        if sig.root_cause == "last-exception" and self._death_root is not None:
            root_line, root_text, context = self._death_root[0], self._death_root[1], self._death_root[2]
            if root_line != fire.lineno:
                context = context + [_cap(root_text, CONTEXT_LINE_CHARS)]
            else:
                context = fire.context
        else:
            root_line, root_text = fire.root
            context = fire.context
        others = [
            st.sig.id
            for st in sorted(fired, key=lambda st: (-st.sig.priority, st.fire.lineno))  # type: ignore[union-attr]
            if st is not best
        ]
        return ClassificationResult(
            crashed=True,
            signature=sig.id,
            title=sig.title,
            kind=sig.kind,
            generic=sig.generic,
            confidence=sig.confidence,
            upstream=sig.upstream,
            upstream_url=self.catalogue.upstream_url(sig.upstream),
            related=list(sig.related),
            bugs=list(sig.bugs),
            priority=sig.priority,
            root_cause=root_text.strip(),
            root_cause_line=root_line,
            matched=[MatchedLine(n, t) for n, t in fire.matched],
            remediation=sig.remediation,
            other_signatures=others,
            context=[strip_prefixes(c)[1] for c in context],
            lines_scanned=self._n,
        )


def classify_text(text: str, catalogue: Catalogue | None = None) -> ClassificationResult:
    """Classify a whole log (or any text) in one go."""
    c = LogClassifier(catalogue)
    c.feed_text(text)
    return c.result()


def classify_lines(lines: Iterable[str], catalogue: Catalogue | None = None) -> ClassificationResult:
    c = LogClassifier(catalogue)
    c.feed_lines(lines)
    return c.result()


def classify_termination_message(message: str | None, catalogue: Catalogue | None = None) -> ClassificationResult:
    """Classify a container's termination message.

    With terminationMessagePolicy FallbackToLogsOnError the kubelet puts the log tail there (at most
    2048 bytes / 80 lines), so the first line may be cut mid-way; that line is matched as it is.
    """
    return classify_text(message or "", catalogue)
