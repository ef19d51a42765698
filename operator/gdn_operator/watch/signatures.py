"""Log classifier over the crash-signature catalogue (catalogue.py, data/signatures.yaml).

    classify_text(text, evidence=None) -> ClassificationResult   one-shot, whole log or termination message
    classify_termination_message(text, evidence=None)           same, for a container's termination message
    LogClassifier().feed_line(line) / .feed_text(text)          incremental core (logstream.py wraps it)

Matching runs on the payload of each line (prefixes.py strips timestamps, ANSI, process prefixes and
logger headers). Lines at DEBUG/INFO/WARNING never trigger a signature (vLLM logs handled exceptions as
WARNING tracebacks in healthy runs); they still reveal facts (model family, spec decode, GDN backend).

Precision first: a signature that names an upstream issue does so only when its attribution holds on
the facts from the log and the spec (evidence.py); otherwise its generic parent class is reported, the
upstream issue is listed under `candidates`, and the remediation is `investigate` (never automatic).

Tails: the operator often sees only the end of a log. An exception line logged at ERROR by an engine or
worker process (or printed unlevelled, outside a handled request error) that is followed by the process
ending (an end marker such as `Application shutdown complete`, or the end of the text within
TAIL_LINES) is a crash, found without the traceback header (classes `engine-error-exit`,
`unhandled-exception`).

Modules: catalogue.py (schema, validation), prefixes.py (line prefixes), evidence.py (facts and
attribution), result.py (ClassificationResult); this module keeps the matching core and re-exports their
public names.

Size (~710 lines): the matching core is one incremental state machine (LogClassifier) whose steps share its
per-line state; the schema, prefixes, evidence and result types already live in their own modules.

Speed: a raw line is only looked at further when it contains a 4-character piece of one of the
catalogue's literal keywords; one precompiled regex scans whole blocks of text for those pieces, so the
noise lines never reach Python code (bench/bench_classifier.py).
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gdn_operator.watch import evidence as _ev
from gdn_operator.watch.catalogue import (  # noqa: F401 - re-exported: the catalogue API lives here too
    ACTIONS,
    CONFIDENCES,
    DEFAULT_REPOS,
    EXCEPTION_KEYWORDS,
    KINDS,
    ROOT_CAUSE_MODES,
    Alternative,
    Catalogue,
    CatalogueError,
    Remedy,
    Signature,
    default_catalogue,
    load_catalogue,
    parse_catalogue,
)
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.prefixes import (  # noqa: F401 - re-exported
    _EXC_LINE,
    NOISE_LEVELS,
    context_of,
    is_exception_line,
    parse_line,
    strip_prefixes,
)
from gdn_operator.watch.result import ClassificationResult, MatchedLine, best_result  # noqa: F401 - re-exported

#: Lines are cut to this many characters before matching (bounded work and memory per line).
MAX_LINE_CHARS = 8192
#: Lines of context (the traceback tail) kept with a result.
CONTEXT_LINES = 20
#: Characters kept per context line.
CONTEXT_LINE_CHARS = 512
#: An exception line further than this many lines above an engine-death marker is not its root cause.
ROOT_CAUSE_MAX_DISTANCE = 2000
#: A logged exception this close to the end of the text is the last thing the process did (a tail).
TAIL_LINES = 40
#: Facts (model family, spec decode, ...) are logged at startup: after this many lines, or once all are
#: known, lines holding only a fact keyword are no longer looked at (facts in tracebacks still are).
FACT_SCAN_LINES = 50_000
#: ... or this close before an end marker (other ranks' tracebacks and the shutdown chatter come between).
END_WINDOW = 1000
#: An unlevelled exception this close after a handled-request marker belongs to that request.
HANDLED_WINDOW = 400
_HANDLED = re.compile(r"Exception in ASGI application|Exception in callback|Task exception was never retrieved")
#: Python's chained-exception lines: the exception above them is the cause of the one below.
_CHAIN = re.compile(
    r"^(?:The above exception was the direct cause of the following exception"
    r"|During handling of the above exception, another exception occurred):?\s*$"
)
#: An exception chain is one traceback block: a cause further above than this is another crash's.
CHAIN_WINDOW = 400
#: pydantic's header line: the message that says what is wrong is on a following line.
_PYDANTIC_HEADER = re.compile(r"ValidationError: \d+ validation errors? for \w+")
_PYDANTIC_FIELD = re.compile(r"[\w.\[\]-]+")
_PYDANTIC_TAIL = re.compile(r"\s*\[type=[^\]]*(?:\]|$).*$")
#: an exception line without its message (`RuntimeError:`): the message is on the next line
_EMPTY_MESSAGE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Fault):\s*$")
#: refined root causes kept (original line -> refined), oldest dropped first
MAX_REFINED = 64
#: an exception raised without a message (`AssertionError` from a bare `assert`): the statement and the frame
#: above it in the traceback say what failed (issue 47)
_BARE_EXC = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)\s*$")
_FRAME = re.compile(r'^File "(?:[^"]*/)?([^"/]+)", line (\d+), in (\S+)')
_MARKERS = re.compile(r"^[\s^~]*$")
#: the executor's wrapper around a worker's exception message (multiproc_executor.py, 0.17.0-0.34.0); a cut log
#: may lose its closing quote
_WRAPPED = re.compile(r"^(?:RuntimeError: )?Worker failed with error '(.+?)'?(?:, please check the stack trace above.*)?$")


# ------------------------------------------------------------------------------------------------
# classifier core


class _Fire:
    __slots__ = ("lineno", "root", "matched", "context", "confidence")

    def __init__(
        self, lineno: int, root: tuple[int, str], matched: list[tuple[int, str]], context: list[str], confidence: str | None
    ):
        self.lineno = lineno
        self.root = root
        self.matched = matched
        self.context = context
        self.confidence = confidence


class _SigState:
    __slots__ = ("sig", "last", "fire", "last_unless")

    def __init__(self, sig: Signature):
        self.sig = sig
        # per alternative, per pattern: (lineno, payload) of the last matching line
        self.last: list[list[tuple[int, str] | None]] = [[None] * len(a.patterns) for a in sig.alternatives]
        self.fire: _Fire | None = None
        self.last_unless = -(10**12)


class _Exc:
    __slots__ = ("line", "text", "context", "level", "where", "handled", "cause")

    def __init__(self, line: int, text: str, context: list[str], level: str | None, where: str, handled: bool):
        self.line, self.text, self.context = line, text, context
        self.level, self.where, self.handled = level, where, handled
        self.cause: _Exc | None = None  # the first exception of a chain (`The above exception was ...`)

    @property
    def root(self) -> _Exc:
        return self.cause or self


@dataclass
class _Pick:
    """A fired signature (or the class it falls back to) competing to be the result."""

    id: str
    title: str
    kind: str
    generic: bool
    upstream: str | None
    related: tuple[str, ...]
    bugs: tuple[str, ...]
    priority: int
    confidence: str
    remediation: Remedy
    root_mode: str
    fire: _Fire


def _cap(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n]


def _pick(sig: Signature, fire: _Fire) -> _Pick:
    return _Pick(
        sig.id,
        sig.title,
        sig.kind,
        sig.generic,
        sig.upstream,
        sig.related,
        sig.bugs,
        sig.priority,
        fire.confidence or sig.confidence,
        sig.remediation,
        sig.root_cause,
        fire,
    )


class LogClassifier:
    """Incremental classifier over complete log lines. Memory is bounded by the catalogue size.

    feed_line(line) for one line (no trailing newline); feed_text(text) for a block of complete lines
    (split on '\\n'; a final line without '\\n' counts as complete). result() can be called any time.
    `evidence` (facts from the spec the operator rendered) is used to decide which upstream issue to name.
    """

    def __init__(
        self, catalogue: Catalogue | None = None, max_line_chars: int = MAX_LINE_CHARS, evidence: Evidence | None = None
    ):
        self.catalogue = catalogue or default_catalogue()
        self.max_line_chars = max_line_chars
        self.evidence = evidence
        self._states = [_SigState(s) for s in self.catalogue.signatures]
        self._scan_rx = self.catalogue.scan_regex
        self._search = self._scan_rx.search
        self._steady = False  # switched to the prefilter without fact keywords
        self._secondary = self.catalogue.secondary
        self._fact_rules = self.catalogue.facts
        self._end_kw = self.catalogue.end_keywords
        self._end_rx = self.catalogue.end_regex
        self._tail: deque[str] = deque(maxlen=CONTEXT_LINES)
        self._n = 0
        self._last_exc: _Exc | None = None
        # engine-death root cause (root_cause: last-exception signatures)
        self._death_root: tuple[int, str, list[str]] | None = None
        self._facts: dict[str, str] = {}
        self._version: str | None = None
        self._handled_line = -(10**12)
        self._last_end = -(10**12)
        # multi-line exception messages (issue 26): the exception whose message is on the next lines
        self._pending: _Exc | None = None
        self._pending_pydantic = False
        self._pending_left = 0
        self._refined: dict[int, tuple[int, str]] = {}
        self._chain_cause: _Exc | None = None
        self._chain_at = -(10**12)

    # -- feeding --------------------------------------------------------------------------------
    @property
    def lines_scanned(self) -> int:
        return self._n

    def feed_line(self, line: str) -> None:
        if "\n" in line:
            self.feed_text(line)
            return
        if len(line) > self.max_line_chars:
            line = line[: self.max_line_chars]
        self._n += 1
        if self._pending is not None:
            self._continue(line, self._n)
        if self._search(line) is not None:
            tail = list(self._tail)
            self._process(line, self._n, lambda: tail)
            if not self._steady and self._facts_done():
                self._go_steady()
        if not self._steady and self._n >= FACT_SCAN_LINES:
            self._go_steady()
        self._tail.append(line if len(line) <= CONTEXT_LINE_CHARS else line[:CONTEXT_LINE_CHARS])

    def _facts_done(self) -> bool:
        return self._version is not None and len(self._facts) == len({r.fact for r in self._fact_rules if r.value})

    def _go_steady(self) -> None:
        self._steady = True
        self._scan_rx = self.catalogue.steady_regex
        self._search = self._scan_rx.search

    def feed_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.feed_line(line)

    def feed_text(self, text: str) -> None:
        if not text:
            return
        body_end = len(text) - 1 if text.endswith("\n") else len(text)
        # candidate lines: those holding a piece of a catalogue keyword (one C-level regex scan)
        search = self._scan_rx.search
        find = text.find
        base = self._n
        if self._pending is not None:
            self._peek(text, 0, base + 1)
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
            if not self._steady and lineno >= FACT_SCAN_LINES:
                # past the startup: the same cut as feed_line's; look at this line again with the steady filter
                self._go_steady()
                search = self._scan_rx.search
                pos = ls
                continue
            line = text[ls : min(le, ls + cap)]
            self._process(line, lineno + 1, functools.partial(self._context_in, text, ls))
            if self._pending is not None:
                self._peek(text, le + 1, lineno + 2)
            if not self._steady and self._facts_done():
                self._go_steady()  # nothing a fact-only line could change any more
                search = self._scan_rx.search
            pos = le + 1
        self._n = base + text.count("\n", 0, body_end) + 1
        if not self._steady and self._n >= FACT_SCAN_LINES:
            self._go_steady()
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

    # -- multi-line exception messages ----------------------------------------------------------
    def _peek(self, text: str, pos: int, lineno: int) -> None:
        """Hand the lines from offset `pos` (line `lineno`) to _continue while an exception waits for its message."""
        while self._pending is not None and pos < len(text):
            end = text.find("\n", pos)
            if end == -1:
                end = len(text)
            self._continue(text[pos : min(end, pos + self.max_line_chars)], lineno)
            pos, lineno = end + 1, lineno + 1

    def _expect_message(self, exc: _Exc) -> None:
        """An exception line whose message is on the following lines: pydantic's header (`1 validation error
        for ModelConfig`, then the field and the message), or `RuntimeError:` with nothing after the colon."""
        if _PYDANTIC_HEADER.search(exc.text):
            self._pending, self._pending_pydantic, self._pending_left = exc, True, 4
        elif _EMPTY_MESSAGE.match(exc.text):
            self._pending, self._pending_pydantic, self._pending_left = exc, False, 2

    def _continue(self, raw: str, lineno: int) -> None:
        exc = self._pending
        self._pending_left -= 1
        if exc is None or self._pending_left <= 0:
            self._pending = None
        if exc is None:
            return
        text = parse_line(raw).payload.strip()
        if not text or (self._pending_pydantic and _PYDANTIC_FIELD.fullmatch(text)):
            return  # a blank line, or the field path pydantic prints above the message
        self._pending = None
        if text.startswith(("Traceback (most recent call last)", "File ", "For further information")):
            return
        if self._pending_pydantic:
            refined = (lineno, _PYDANTIC_TAIL.sub("", text) or text)
        else:
            refined = (exc.line, f"{exc.text.rstrip()} {text}")
        if len(self._refined) >= MAX_REFINED:
            self._refined.pop(next(iter(self._refined)))
        self._refined[exc.line] = refined

    def _refine_bare(self, exc: _Exc) -> None:
        """`AssertionError` alone: take the failing statement and its frame from the traceback lines above it,
        e.g. `AssertionError (assert intermediate_tensors is not None; qwen3_next_mtp.py:120 in forward)`."""
        stmt = None
        for raw in reversed(exc.context[-6:]):
            text = parse_line(raw).payload.strip()
            if not text or _MARKERS.match(text):
                continue
            if stmt is None:
                if text.startswith(("File ", "Traceback")):
                    return
                stmt = text
                continue
            m = _FRAME.match(text)
            where = f"; {m.group(1)}:{m.group(2)} in {m.group(3)}" if m else ""
            refined = (exc.line, f"{exc.text.strip()} ({stmt}{where})")
            if len(self._refined) >= MAX_REFINED:
                self._refined.pop(next(iter(self._refined)))
            self._refined[exc.line] = refined
            return

    def _root(self, line: int, text: str) -> tuple[int, str]:
        """A root-cause line, moved to the line that says what is wrong when its message continues below, and
        unwrapped from `Worker failed with error '...'` (the worker's own message is the root cause)."""
        line, text = self._refined.get(line, (line, text))
        m = _WRAPPED.match(text.strip())
        return (line, m.group(1)) if m else (line, text)

    # -- matching -------------------------------------------------------------------------------
    def _learn_facts(self, line: str, payload: str) -> None:
        for rule in self._fact_rules:
            if rule.value is None:
                if self._version is not None:
                    continue
            elif rule.fact in self._facts:
                continue
            for kw in rule.keywords:
                if kw in line:
                    break
            else:
                continue
            for p in rule.patterns:
                m = p.search(payload)
                if m:
                    if rule.value is None:
                        self._version = m.group(1)
                    else:
                        self._facts[rule.fact] = rule.value
                    break

    def _process(self, line: str, lineno: int, ctx: Callable[[], list[str]]) -> None:
        parsed = parse_line(line)
        level, payload = parsed.level, parsed.payload
        if not payload:
            return
        if self._fact_rules:
            self._learn_facts(line, payload)
        for kw in self._end_kw:
            if kw in line:
                if self._end_rx.search(payload):
                    self._last_end = lineno
                break
        noisy = level in NOISE_LEVELS
        if "above exception" in payload and _CHAIN.match(payload.strip()) and self._last_exc is not None:
            self._chain_cause, self._chain_at = self._last_exc.root, lineno
        if "Exception" in payload and _HANDLED.search(payload):
            self._handled_line = lineno
        secondary: bool | None = None
        if not noisy and _EXC_LINE.match(payload):
            secondary = self._secondary.search(payload) is not None
            # `Worker failed with error '...'` reports a worker's exception: it stands for it when the worker's own
            # traceback is not in the text (a tail that kept only EngineCore's lines; issue 47)
            le = self._last_exc
            stands_in = (
                secondary
                and "Worker failed with error" in payload
                and _WRAPPED.match(payload.strip()) is not None
                and (le is None or lineno - le.line > CHAIN_WINDOW)
            )
            if not secondary or stands_in:
                where = context_of(parsed)
                handled = where != "engine" and lineno - self._handled_line <= HANDLED_WINDOW
                exc = _Exc(lineno, payload, ctx(), level, where, handled)
                if self._chain_cause is not None and 0 < lineno - self._chain_at <= CHAIN_WINDOW:
                    exc.cause = self._chain_cause
                self._chain_cause = None
                self._last_exc = exc
                self._expect_message(exc)
                if _BARE_EXC.match(payload.strip()):
                    self._refine_bare(exc)
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
            upgrade_only = False
            if st.fire is not None and sig.root_cause != "last-exception":
                if st.fire.confidence is None:
                    continue
                upgrade_only = True  # a weaker alternative fired: a stronger one may still replace it
            for alt, last in zip(sig.alternatives, st.last, strict=True):
                if upgrade_only and alt.confidence is not None:
                    continue
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
                self._fire(st, lineno, payload, last, ctx, alt.confidence)  # type: ignore[arg-type]
                break

    def _fire(
        self,
        st: _SigState,
        lineno: int,
        payload: str,
        last: list[tuple[int, str]],
        ctx: Callable[[], list[str]],
        confidence: str | None,
    ) -> None:
        sig = st.sig
        if sig.root_cause == "last-exception":
            le = self._last_exc
            if le is not None and 0 <= lineno - le.line <= ROOT_CAUSE_MAX_DISTANCE:
                r = le.root
                self._death_root = (r.line, r.text, r.context)
            elif self._death_root is None:
                self._death_root = (lineno, payload, ctx())
            if st.fire is not None:
                return
        matched = sorted(set(last))
        st.fire = _Fire(lineno, last[0], matched, ctx() + [_cap(payload, CONTEXT_LINE_CHARS)], confidence)

    # -- result ---------------------------------------------------------------------------------
    def _pending_exit(self) -> _Exc | None:
        """The last logged exception, when the process ended right after it (see the module docstring)."""
        le = self._last_exc
        if le is None or le.handled or le.where == "request":
            return None
        if 0 < self._last_end - le.line <= END_WINDOW or self._n - le.line <= TAIL_LINES:
            return le
        return None

    @property
    def crashed(self) -> bool:
        return any(st.fire is not None for st in self._states) or self._pending_exit() is not None

    @property
    def facts(self) -> dict[str, str]:
        """Facts about the server learnt from the log so far (vllm_version included when seen)."""
        out = dict(self._facts)
        if self._version:
            out["vllm_version"] = self._version
        return out

    def result(self, evidence: Evidence | None = None) -> ClassificationResult:
        """The classification of everything fed so far; `evidence` overrides the constructor's."""
        ev = evidence if evidence is not None else self.evidence
        facts, version, sources = _ev.merge(self._facts, self._version, ev)
        shown = {k: f"{v} ({sources[k]})" for k, v in facts.items()}
        if version:
            shown["vllm_version"] = f"{version} ({sources['vllm_version']})"
        fired = [st for st in self._states if st.fire is not None]
        conflicts = _ev.contradictions(self._facts, ev)
        if not fired:
            return self._exit_result(shown, conflicts)
        fired_ids = {st.sig.id for st in fired}
        cat = self.catalogue
        picks: list[_Pick] = []
        candidates: list[str] = []
        notes: list[str] = list(conflicts)
        for st in fired:
            sig, fire = st.sig, st.fire
            if fire is None:  # `fired` holds only states that fired; this narrows the type
                continue
            if sig.attribution is None:
                picks.append(_pick(sig, fire))
                continue
            why = _ev.check(sig.attribution, facts, version)
            if why is None:
                picks.append(_pick(sig, fire))
                continue
            for ref in (sig.upstream, *sig.related):
                if ref and ref not in candidates:
                    candidates.append(ref)
            notes.append(f"{sig.upstream} ({sig.id}) not named: {why}")
            shares_line = any(
                o is not st
                and o.fire is not None
                and not o.sig.generic
                and o.sig.attribution is None
                and o.fire.root[0] == fire.root[0]
                for o in fired
            )
            if sig.parent in fired_ids or shares_line:
                continue  # the generic class fired on the same evidence: it will be reported
            if sig.parent in cat.classes:
                c = cat.classes[sig.parent]
                picks.append(
                    _Pick(
                        c.id,
                        c.title,
                        c.kind,
                        False,
                        None,
                        (),
                        sig.bugs,
                        sig.priority,
                        "probable",
                        Remedy("investigate", c.hint or sig.remediation.hint),
                        "match",
                        fire,
                    )
                )
            else:
                p = _pick(cat.get(sig.parent), fire)  # type: ignore[arg-type]
                picks.append(p)
        specific = [p for p in picks if not p.generic]
        pool = specific or picks
        best = max(pool, key=lambda p: (p.priority, -p.fire.lineno))
        fire = best.fire
        if best.root_mode == "last-exception" and self._death_root is not None:
            root_line, root_text, context = self._death_root
            context = context + [_cap(root_text, CONTEXT_LINE_CHARS)] if root_line != fire.lineno else fire.context
        else:
            root_line, root_text = fire.root
            context = fire.context
        root_line, root_text = self._root(root_line, root_text)
        others = [p.id for p in sorted(picks, key=lambda p: (-p.priority, p.fire.lineno)) if p is not best]
        if best.upstream is None:
            for ref in best.related:
                if ref not in candidates:
                    candidates.append(ref)
        if_versions = None
        if best.upstream is not None:
            if_versions = _ev.unknown_version(cat.get(best.id).attribution, version)
            if if_versions is not None:
                notes.append(f"{best.upstream} affects vLLM {if_versions} only; neither the log nor the spec gives the version")
        return ClassificationResult(
            crashed=True,
            signature=best.id,
            title=best.title,
            kind=best.kind,
            generic=best.generic,
            confidence=best.confidence,
            upstream=best.upstream,
            upstream_url=cat.upstream_url(best.upstream),
            related=list(best.related),
            bugs=list(best.bugs),
            priority=best.priority,
            root_cause=root_text.strip(),
            root_cause_line=root_line,
            matched=[MatchedLine(n, t) for n, t in fire.matched],
            remediation=best.remediation,
            other_signatures=list(dict.fromkeys(others)),
            context=[strip_prefixes(c)[1] for c in context],
            lines_scanned=self._n,
            candidates=candidates if best.upstream is None else [],
            attribution=notes,
            evidence=shown,
            upstream_if_versions=if_versions,
        )

    def _exit_result(self, shown: dict[str, str], conflicts: list[str]) -> ClassificationResult:
        le = self._pending_exit()
        if le is None:
            return ClassificationResult(crashed=False, lines_scanned=self._n, evidence=shown)
        cat = self.catalogue
        if le.level is None and any(s.id == "unhandled-exception" for s in cat.signatures):
            s = cat.get("unhandled-exception")
            sid, title, kind, rem = s.id, s.title, s.kind, s.remediation
        elif "engine-error-exit" in cat.classes:
            c = cat.classes["engine-error-exit"]
            sid, title, kind, rem = c.id, c.title, c.kind, Remedy("investigate", c.hint)
        else:
            return ClassificationResult(crashed=False, lines_scanned=self._n, evidence=shown)
        root_line, root_text = self._root(le.root.line, le.root.text)
        return ClassificationResult(
            crashed=True,
            signature=sid,
            title=title,
            kind=kind,
            generic=True,
            confidence="probable",
            priority=1,
            root_cause=root_text.strip(),
            root_cause_line=root_line,
            matched=[MatchedLine(le.line, le.text)],
            remediation=rem,
            context=[strip_prefixes(c)[1] for c in le.context + [_cap(le.text, CONTEXT_LINE_CHARS)]],
            lines_scanned=self._n,
            attribution=conflicts,
            evidence=shown,
        )


def classify_text(text: str, catalogue: Catalogue | None = None, evidence: Evidence | None = None) -> ClassificationResult:
    """Classify a whole log (or any text) in one go."""
    c = LogClassifier(catalogue, evidence=evidence)
    c.feed_text(text)
    return c.result()


def classify_lines(
    lines: Iterable[str], catalogue: Catalogue | None = None, evidence: Evidence | None = None
) -> ClassificationResult:
    c = LogClassifier(catalogue, evidence=evidence)
    c.feed_lines(lines)
    return c.result()


def classify_termination_message(
    message: str | None, catalogue: Catalogue | None = None, evidence: Evidence | None = None
) -> ClassificationResult:
    """Classify a container's termination message.

    With terminationMessagePolicy FallbackToLogsOnError the kubelet puts the log tail there (at most
    2048 bytes / 80 lines), so the first line may be cut mid-way; that line is matched as it is.
    """
    return classify_text(message or "", catalogue, evidence)
