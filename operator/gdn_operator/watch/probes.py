"""Output probes, the pure part: compare one answer with its expectation, judge a round (learning the
reference where a probe says `expected: learn`), and the per-server state machine that turns rounds into
the OutputConsistent condition.

    verdict = compare(expected, answer, ("prefix", 8))
    book = ProbeBook(["capital", "count"], threshold=3)
    outcomes, learned = judge_round(probes, reference, asked)
    change = book.observe(outcomes)          # the condition after this round

Nothing here does I/O; the HTTP client is watch/probe_client.py, the wiring handlers/engines/probes.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gdn_operator.api.probes import Probe

PASS = "pass"
LEARNED = "learned"
MISMATCH = "mismatch"
EARLY_STOP = "early-stop"
ERROR = "error"
RESULTS = (PASS, LEARNED, MISMATCH, EARLY_STOP, ERROR)

#: Condition reasons for OutputConsistent=False: only a wrong answer says the output is inconsistent.
REASONS = {MISMATCH: "ProbeMismatch", EARLY_STOP: "ProbeEarlyStop"}
#: Why a probe got no answer (Asked.error) -> the reason OutputConsistent=Unknown carries once that lasts
#: `failureThreshold` rounds: a configuration gap (the engine wants an API key the operator does not send) or an
#: engine that does not answer is not silent corruption (issue 38). Metric gdn_probe_failing, alert at warning.
ERROR_REASONS = {
    "auth": "ProbeUnauthorized",
    "connect": "ProbeUnreachable",
    "timeout": "ProbeTimeout",
    "http": "ProbeError",
    "parse": "ProbeError",
}
ERROR_REASON = "ProbeError"  # an error of no known cause
#: Which failure names a round when several probes/pods fail: a wrong answer says the most.
_RANK = {PASS: 0, LEARNED: 0, ERROR: 1, EARLY_STOP: 2, MISMATCH: 3}


def error_reason(cause: str | None) -> str:
    """The condition reason of a probe error by its cause (Asked.error)."""
    return ERROR_REASONS.get(cause or "", ERROR_REASON)


SNIPPET = 6  # tokens shown from the first difference
SNIPPET_CHARS = 40


@dataclass(frozen=True, slots=True)
class Answer:
    """What the engine generated: token ids when it returns them (vLLM `return_token_ids`), and text."""

    token_ids: tuple[int, ...] | None
    text: str = ""
    finish_reason: str | None = None

    def to_status(self, probe: str) -> dict[str, Any]:
        out: dict[str, Any] = {"probe": probe, "text": self.text[:512]}
        if self.token_ids is not None:
            out["tokenIds"] = list(self.token_ids)
        if self.finish_reason:
            out["finishReason"] = self.finish_reason
        return out

    @classmethod
    def from_status(cls, d: dict[str, Any]) -> Answer:
        ids = d.get("tokenIds")
        return cls(tuple(ids) if ids is not None else None, d.get("text") or "", d.get("finishReason"))

    @classmethod
    def expected_of(cls, probe: Probe) -> Answer | None:
        """The expectation a probe gives itself (None for learn)."""
        if probe.expected_token_ids is not None:
            return cls(tuple(probe.expected_token_ids), "", None)
        if probe.expects_text:
            return cls(None, probe.expected, None)
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    result: str  # pass | mismatch | early-stop | error (learned is set by judge_round)
    position: int | None = None
    expected: str | None = None
    got: str | None = None
    message: str = ""
    cause: str | None = None  # errors: auth | connect | timeout | http | parse (Asked.error)

    @property
    def failed(self) -> bool:
        return self.result in (MISMATCH, EARLY_STOP, ERROR)


def _snip(seq: Sequence[Any] | str, i: int, tokens: bool) -> str:
    if tokens:
        part = list(seq[i : i + SNIPPET])
        more = ", …" if len(seq) > i + SNIPPET else ""
        return "[" + ", ".join(str(t) for t in part) + more + "]"
    return repr(seq[i : i + SNIPPET_CHARS]) + ("…" if len(seq) > i + SNIPPET_CHARS else "")


def compare(expected: Answer | None, got: Answer, comparison: tuple[str, int | None]) -> Verdict:
    """Judge one answer. `comparison` is Probe.comparison: (exact | prefix | minLength, N or None)."""
    kind, n = comparison
    tokens = got.token_ids is not None and (expected is None or expected.token_ids is not None)
    have: Sequence[Any] | str = got.token_ids if tokens else got.text  # type: ignore[assignment]
    unit = "token" if tokens else "character"
    if kind == "minLength":
        if n is None:
            raise ValueError("minLength comparison without a length (Probe.comparison gives one)")
        count = len(got.token_ids) if got.token_ids is not None else len(got.text)
        u = "token" if got.token_ids is not None else "character"
        if count < n:
            return Verdict(
                EARLY_STOP,
                count,
                None,
                None,
                f"stopped after {count} {u}s ({got.finish_reason or 'no finish reason'}), expected at least {n}",
            )
        return Verdict(PASS)
    if expected is None:
        raise ValueError("compare() needs an expectation except in minLength mode")
    want: Sequence[Any] | str = expected.token_ids if tokens else expected.text  # type: ignore[assignment]
    if not tokens and not got.text and got.token_ids is not None:
        return Verdict(
            MISMATCH,
            0,
            _snip(want, 0, False),
            "''",
            "the engine returned token ids but no text (served without a tokenizer?): give expectedTokenIds",
        )
    span = len(want) if kind == "exact" or n is None else min(n, len(want))
    common = min(span, len(have))
    for i in range(common):
        if have[i] != want[i]:
            return Verdict(MISMATCH, i, _snip(want, i, tokens), _snip(have, i, tokens), f"{unit} {i} differs")
    if len(have) < span:
        return Verdict(
            EARLY_STOP,
            len(have),
            _snip(want, len(have), tokens),
            _snip(have, len(have), tokens),
            f"stopped after {len(have)} {unit}s ({got.finish_reason or 'no finish reason'}), expected {span}",
        )
    ended_early_in_reference = expected.finish_reason == "stop" and n is not None and len(want) < n
    if (kind == "exact" or ended_early_in_reference) and len(have) > len(want):
        i = len(want)
        return Verdict(MISMATCH, i, "<end>", _snip(have, i, tokens), f"continued past the expected end at {unit} {i}")
    return Verdict(PASS)


@dataclass(frozen=True, slots=True)
class Asked:
    """One probe request to one pod: the answer, or an error."""

    pod: str
    probe: str
    answer: Answer | None
    error: str | None = None  # auth | timeout | connect | http | parse
    message: str = ""
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    probe: str
    verdict: Verdict
    duration: float = 0.0

    @property
    def result(self) -> str:
        return self.verdict.result


def judge_round(
    probes: Sequence[Probe], reference: dict[str, Answer], asked: Iterable[Asked]
) -> tuple[list[Outcome], dict[str, tuple[str, Answer]]]:
    """Judge a round. A learning probe without a reference takes the first answer (pods in the order
    given) as its reference: that outcome is `learned`, the others of the round compare with it.
    Returns the outcomes and what was learned (probe → (pod, answer))."""
    by_name = {p.name: p for p in probes}
    ref = dict(reference)
    learned: dict[str, tuple[str, Answer]] = {}
    out: list[Outcome] = []
    for a in asked:
        p = by_name.get(a.probe)
        if p is None:
            continue
        if a.answer is None:
            verdict = Verdict(ERROR, message=f"{a.error or 'error'}: {a.message}"[:300], cause=a.error)
            out.append(Outcome(a.pod, a.probe, verdict, a.duration))
            continue
        kind, n = p.comparison
        expected = Answer.expected_of(p)
        if expected is None and kind != "minLength":
            expected = ref.get(p.name)
            if expected is None:
                ref[p.name] = a.answer
                learned[p.name] = (a.pod, a.answer)
                out.append(Outcome(a.pod, a.probe, Verdict(LEARNED), a.duration))
                continue
        out.append(Outcome(a.pod, a.probe, compare(expected, a.answer, (kind, n)), a.duration))
    return out, learned


# --------------------------------------------------------------------------------- state machine ---


@dataclass
class Track:
    """One probe's history on the current generation. `wrong`: the last wrong answer (mismatch or early stop)
    of the current failing streak, so a streak that saw one stays an inconsistency when the engine then stops
    answering."""

    consecutive: int = 0
    last_result: str | None = None
    last_failure: dict[str, Any] | None = None
    wrong: dict[str, Any] | None = None

    def to_status(self, probe: str) -> dict[str, Any]:
        out: dict[str, Any] = {"probe": probe, "consecutiveFailures": self.consecutive}
        if self.last_result:
            out["lastResult"] = self.last_result
        if self.last_failure:
            out["lastFailure"] = self.last_failure
        if self.wrong and self.wrong is not self.last_failure:
            out["lastWrongAnswer"] = self.wrong
        return out

    @property
    def alarm(self) -> tuple[str, dict[str, Any]]:
        """(failure, its record) this track alarms with: its streak's wrong answer, else its last error."""
        if self.wrong is not None:
            return str(self.wrong.get("result") or MISMATCH), self.wrong
        return ERROR, self.last_failure or {}


@dataclass(frozen=True)
class Condition:
    value: bool | None  # OutputConsistent: True / False / None (Unknown)
    reason: str
    message: str
    failure: str | None = None  # mismatch | early-stop when False; error when Unknown because probes get no answer


LEARNING = Condition(None, "Learning", "waiting for the first probe round on an engine of this generation")


@dataclass
class ProbeBook:
    """Per-server state machine: consecutive failing rounds per probe → OutputConsistent.

    * a probe's round fails when it fails on any pod (the worst result names it);
    * False as soon as one probe has failed `threshold` rounds in a row with a wrong answer among them (reason
      ProbeMismatch / ProbeEarlyStop); Unknown when those rounds got no answer at all (reason by cause:
      ProbeUnauthorized, ProbeUnreachable, ProbeTimeout, ProbeError) — the probes cannot tell, so they say so;
    * True when every probe passed (or learned) in the latest round it was asked;
    * otherwise unchanged: a single blip below the threshold never alarms, and a partial recovery does not
      clear an alarm.
    """

    names: list[str]
    threshold: int
    tracks: dict[str, Track] = field(default_factory=dict)
    condition: Condition = LEARNING
    rounds: int = 0

    def __post_init__(self) -> None:
        for n in self.names:
            self.tracks.setdefault(n, Track())
        for n in list(self.tracks):
            if n not in self.names:
                del self.tracks[n]

    def observe(self, outcomes: Sequence[Outcome], now: str = "") -> Condition:
        worst: dict[str, Outcome] = {}
        pods: dict[str, set[str]] = {}
        for o in outcomes:
            if o.probe not in self.tracks:
                continue
            pods.setdefault(o.probe, set()).add(o.pod)
            if o.probe not in worst or _RANK[o.result] > _RANK[worst[o.probe].result]:
                worst[o.probe] = o
        if not worst:
            return self.condition
        self.rounds += 1
        for name, o in worst.items():
            t = self.tracks[name]
            t.last_result = o.result
            if o.verdict.failed:
                t.consecutive += 1
                v = o.verdict
                t.last_failure = {
                    k: val
                    for k, val in {
                        "time": now or None,
                        "pod": o.pod,
                        "result": o.result,
                        "cause": v.cause,
                        "position": v.position,
                        "expected": v.expected,
                        "got": v.got,
                        "message": v.message,
                    }.items()
                    if val is not None
                }
                if o.result in REASONS:
                    t.wrong = t.last_failure
            else:
                t.consecutive = 0
                t.wrong = None
        alarmed = [(n, t) for n, t in self.tracks.items() if t.consecutive >= self.threshold]
        if alarmed:
            name, t = max(alarmed, key=lambda nt: (_RANK[nt[1].alarm[0]], nt[1].consecutive))
            failure, lf = t.alarm
            where = f" on pod {lf['pod']}" if lf.get("pod") else ""
            detail = lf.get("message", "")
            if lf.get("expected") is not None or lf.get("got") is not None:
                detail += f" (expected {lf.get('expected')}, got {lf.get('got')})"
            others = len(alarmed) - 1
            if failure in REASONS:
                msg = f"probe {name} failed {t.consecutive} rounds in a row{where}: {failure}: {detail}"
                if others:
                    msg += f"; {others} more probe(s) failing"
                self.condition = Condition(False, REASONS[failure], msg, failure)
            else:
                reason = error_reason(lf.get("cause"))
                msg = (
                    f"probe {name} got no answer {t.consecutive} rounds in a row{where} ({detail}): the output "
                    "cannot be checked; this is not a wrong answer"
                )
                if others:
                    msg += f"; {others} more probe(s) failing"
                self.condition = Condition(None, reason, msg, ERROR)
        elif all(t.last_result in (PASS, LEARNED) for t in self.tracks.values()):
            n_pods = len(set().union(*pods.values())) if pods else 0
            self.condition = Condition(
                True, "ProbesPassing", f"{len(self.tracks)} probe(s) answered as expected on {n_pods} pod(s)"
            )
        return self.condition

    @property
    def state(self) -> str:
        if self.condition.value is True:
            return "Consistent" if not any(t.consecutive for t in self.tracks.values()) else "Failing"
        if self.condition.value is False:
            return "Inconsistent"
        if self.condition.failure == ERROR:
            return "NoAnswer"
        return "Failing" if any(t.consecutive for t in self.tracks.values()) else "Learning"

    def results(self) -> list[dict[str, Any]]:
        return [self.tracks[n].to_status(n) for n in self.names]

    @classmethod
    def restore(
        cls, names: list[str], threshold: int, results: Iterable[dict[str, Any]], condition: dict[str, Any] | None
    ) -> ProbeBook:
        """Rebuild from status (after an operator restart) so counts and the alarm carry over."""
        tracks = {}
        for r in results:
            if r.get("probe") not in names:
                continue
            last = r.get("lastFailure")
            wrong = r.get("lastWrongAnswer") or (last if last and last.get("result") in REASONS else None)
            count = int(r.get("consecutiveFailures") or 0)
            tracks[r["probe"]] = Track(count, r.get("lastResult"), last, wrong if count else None)
        book = cls(list(names), threshold, tracks)
        reason = (condition or {}).get("reason", "")
        if condition and condition.get("status") in ("True", "False"):
            value = condition["status"] == "True"
            failure = next((k for k, v in REASONS.items() if v == reason), None)
            book.condition = Condition(value, reason, condition.get("message", ""), failure)
        elif condition and condition.get("status") == "Unknown" and reason in set(ERROR_REASONS.values()):
            book.condition = Condition(None, reason, condition.get("message", ""), ERROR)
        return book
