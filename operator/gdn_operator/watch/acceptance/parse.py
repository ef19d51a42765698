"""Parsing: one Prometheus text exposition of a vLLM engine → one :class:`EngineSnapshot`.

:func:`parse_exposition` sums the counters over the ``engine`` / ``model_name`` label sets of one pod.
It reads only the sample lines of the ~15 families below and never parses the rest: one regular
expression (:data:`_SAMPLE_LINE`) finds those lines inside ``re``, and each is split into labels and
value by two more (a vLLM exposition has ~100 families, ~600 lines and ~55 KB; ~30 lines are read).
A scraper holds one :class:`ExpositionReader`, which also remembers the label sets it has parsed.
At 10,000 engines every 15 s this is what keeps the scrape inside its interval (bench/bench_scrape.py:
~0.1 ms per exposition through a reader, against ~0.8 ms when the kept lines went through prometheus_client's parser).
``tests/watch/test_exposition_scan.py`` holds it equal to a full prometheus_client parse of every real
exposition committed under tests/fixtures and ../shared/fixtures. :func:`snapshot_from_samples` folds
samples from elsewhere (a Prometheus query, ``watch/promsource.py``) by the same rules.

Accepted names (vLLM 0.17 … 0.33, see ../shared/docs/vllm-known-issues.md §6): with or without the
``vllm:`` prefix (``vllm_`` too, for relabelled copies), with or without the ``_total`` suffix that
prometheus_client appends to counters:

``spec_decode_num_drafts``, ``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``,
``spec_decode_num_accepted_tokens_per_pos{position}``, ``generation_tokens``,
``request_success{finished_reason}``, ``request_generation_tokens`` (histogram),
``num_requests_running`` (gauge), and, for the stall detector (``watch/stall.py``), ``prompt_tokens_total``,
``num_requests_waiting`` (gauge) and ``iteration_tokens_total_count`` (engine steps that produced
output: the ``_count`` of the ``iteration_tokens_total`` histogram; its buckets are not kept), and the
``*_created`` timestamps of ``spec_decode_num_drafts`` and
``generation_tokens`` (used to recognise an engine restart).

:meth:`EngineSnapshot.counters` flattens a snapshot into named monotonic counters; the key names
(:func:`position_key`, :func:`finished_key`, :func:`bucket_key`) live here, next to it, and are what
the window (``window.py``) tracks.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "EngineSnapshot",
    "ExpositionParseError",
    "ExpositionReader",
    "GenerationHistogram",
    "bucket_key",
    "finished_key",
    "parse_exposition",
    "position_key",
    "SAMPLE_NAMES",
    "snapshot_from_samples",
]


class ExpositionParseError(ValueError):
    """The /metrics body is not a valid Prometheus text exposition (for the families we read)."""


# What each sample read is, by its name with the `vllm:` / `vllm_` prefix removed (module docstring).
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _ACCEPTED_POS, _GEN_TOKENS, _SUCCESS = range(6)
_GEN_BUCKET, _GEN_COUNT, _GEN_SUM, _RUNNING, _WAITING, _PROMPT, _STEPS, _CREATED = range(6, 14)
_KINDS: dict[str, int] = {
    "spec_decode_num_drafts": _DRAFTS,
    "spec_decode_num_draft_tokens": _DRAFT_TOKENS,
    "spec_decode_num_accepted_tokens": _ACCEPTED,
    "spec_decode_num_accepted_tokens_per_pos": _ACCEPTED_POS,
    "generation_tokens": _GEN_TOKENS,
    "request_success": _SUCCESS,
}
_KINDS.update({name + "_total": kind for name, kind in _KINDS.items()})
_KINDS.update(
    {
        "request_generation_tokens_bucket": _GEN_BUCKET,
        "request_generation_tokens_count": _GEN_COUNT,
        "request_generation_tokens_sum": _GEN_SUM,
        "num_requests_running": _RUNNING,
        "num_requests_waiting": _WAITING,
        "prompt_tokens_total": _PROMPT,
        "iteration_tokens_total_count": _STEPS,
        "spec_decode_num_drafts_created": _CREATED,
        "generation_tokens_created": _CREATED,
    }
)
#: every sample name read (without the ``vllm:`` prefix); ``watch/promsource.py`` queries the same ones
SAMPLE_NAMES: tuple[str, ...] = tuple(sorted(_KINDS))
# the kinds whose samples also say which engines and models a pod has
_ENGINE_KINDS = frozenset(
    {_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _ACCEPTED_POS, _GEN_TOKENS, _SUCCESS, _GEN_BUCKET, _GEN_COUNT, _GEN_SUM, _RUNNING}
)


def _alternation(words: list[bytes]) -> bytes:
    """A regex matching exactly ``words``, factored by common prefix (``re`` then tries one branch per
    byte instead of every name at every line: ~0.06 ms on a 55 KB exposition against ~0.13 ms flat)."""
    branches: dict[bytes, list[bytes]] = {}
    for w in words:
        if w:
            branches.setdefault(w[:1], []).append(w[1:])
    alts = [re.escape(c) + _alternation(rest) for c, rest in sorted(branches.items())]
    if not alts:
        return b""
    body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
    return b"(?:" + body + b")?" if b"" in words else body


# One regex finds the sample lines of exactly those names; every other line (HELP/TYPE comments, the ~90
# other families: ~95% of a 55 KB vLLM exposition) is skipped inside `re` without being split or parsed.
# It starts with a literal newline (the body is searched with one prepended) so that `re` scans for line
# starts quickly (a MULTILINE `^` costs ~3x). The name must end at `{`, a space or a tab, so
# `num_requests_waiting_by_reason` is not `num_requests_waiting`.
_SAMPLE_LINE = re.compile(rb"\n(?:vllm[:_])?(" + _alternation([n.encode() for n in _KINDS]) + rb")([{ \t][^\n]*)")
# labels: name="value" pairs, comma-separated, a trailing comma allowed; escapes \\ \n \" in values
_VALUE = rb'"([^"\\\n]*(?:\\.[^"\\\n]*)*)"'
_PAIR = rb'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\\n]*(?:\\.[^"\\\n]*)*"[ \t]*'
_LABELS_OK = re.compile(rb"(?:" + _PAIR + rb"(?:," + _PAIR + rb")*,?)?[ \t]*")
_LABEL_PAIR = re.compile(rb"([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*" + _VALUE)
_ESCAPE = re.compile(rb"\\(.)")
_UNESCAPED = {b"\\": b"\\", b"n": b"\n", b'"': b'"'}
#: label sets an :class:`ExpositionReader` remembers (they repeat across pods of a model and across scrapes)
MAX_LABEL_SETS = 4096


def _unescape(m: re.Match[bytes]) -> bytes:
    return _UNESCAPED.get(m.group(1), m.group(0))


def _parse_labels(raw: bytes, line: bytes) -> dict[str, str]:
    if not _LABELS_OK.fullmatch(raw):
        raise ExpositionParseError(f"invalid Prometheus exposition: bad labels in {line[:160]!r}")
    out: dict[str, str] = {}
    for k, v in _LABEL_PAIR.findall(raw):
        if b"\\" in v:
            v = _ESCAPE.sub(_unescape, v)
        try:
            out[k.decode()] = v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExpositionParseError(f"invalid Prometheus exposition: label value not UTF-8 in {line[:160]!r}") from exc
    return out


@dataclass(frozen=True, slots=True)
class GenerationHistogram:
    """``vllm:request_generation_tokens`` summed over engines: cumulative bucket counts."""

    bounds: tuple[float, ...]  # ascending upper bounds (``le``), the last one is +Inf
    cumulative: tuple[float, ...]  # cumulative counts, same length as bounds
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One scrape of one pod: counter values summed over the pod's engines, at ``timestamp``.

    ``None`` means "the engine does not expose this metric" (e.g. spec decoding off), never 0.
    """

    timestamp: float
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    request_success: Mapping[str, float] = field(default_factory=dict)  # finished_reason -> count
    generation_length: GenerationHistogram | None = None
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    prompt_tokens: float | None = None
    engine_steps: float | None = None  # iteration_tokens_total_count: engine steps that produced output
    engines: int = 0
    model_names: tuple[str, ...] = ()
    # Earliest `_created` timestamp of the drafts / generation-token counters: changes when the
    # engine process restarts, which is how a reset is recognised even if counters grew past the
    # previous values between two scrapes.
    start_time: float | None = None

    @property
    def spec_decode_enabled(self) -> bool:
        return self.num_drafts is not None and self.num_draft_tokens is not None and self.num_accepted_tokens is not None

    def counters(self) -> dict[str, float]:
        """Flat view of every monotonic counter in this snapshot (key -> value).

        Keys: ``drafts``, ``draft_tokens``, ``accepted``, ``pos:<i>``, ``generation_tokens``,
        ``finished:<reason>``, ``gen_le:<bound>``, ``gen_count``, ``gen_sum``.
        """
        out: dict[str, float] = {}
        if self.num_drafts is not None:
            out["drafts"] = self.num_drafts
        if self.num_draft_tokens is not None:
            out["draft_tokens"] = self.num_draft_tokens
        if self.num_accepted_tokens is not None:
            out["accepted"] = self.num_accepted_tokens
        for i, v in enumerate(self.accepted_per_position):
            out[position_key(i)] = v
        if self.generation_tokens is not None:
            out["generation_tokens"] = self.generation_tokens
        for reason, v in self.request_success.items():
            out[finished_key(reason)] = v
        h = self.generation_length
        if h is not None:
            for b, c in zip(h.bounds, h.cumulative, strict=True):
                out[bucket_key(b)] = c
            out["gen_count"] = h.count
            out["gen_sum"] = h.sum
        return out


def position_key(i: int) -> str:
    """Counter key of the accepted tokens at draft position ``i``."""
    return f"pos:{i}"


def finished_key(reason: str) -> str:
    """Counter key of the requests finished with ``finished_reason`` = ``reason``."""
    return f"finished:{reason}"


def bucket_key(bound: float) -> str:
    """Counter key of the generation-length histogram bucket with upper bound ``bound``."""
    return "gen_le:" + ("+Inf" if math.isinf(bound) else repr(float(bound)))


class _Fold:
    """Sums samples of one pod into the fields of an :class:`EngineSnapshot` (engines and models too)."""

    __slots__ = ("sums", "positions", "success", "buckets", "engines", "models", "created")

    def __init__(self) -> None:
        self.sums: list[float | None] = [None] * 14  # by kind; _ACCEPTED_POS, _SUCCESS, _GEN_BUCKET, _CREATED unused
        self.positions: dict[int, float] = {}
        self.success: dict[str, float] = {}
        self.buckets: dict[float, float] = {}
        self.engines: set[str] = set()
        self.models: set[str] = set()
        self.created: float | None = None

    def add(self, kind: int, name: str, labels: Mapping[str, str], value: float) -> None:
        if kind == _CREATED:
            if self.created is None or value < self.created:
                self.created = value
            return
        if kind == _ACCEPTED_POS:
            try:
                pos = int(labels["position"])
            except (KeyError, ValueError) as exc:
                raise ExpositionParseError(f"{name}: label 'position' missing or not an integer ({dict(labels)})") from exc
            if pos < 0 or pos > 64:
                raise ExpositionParseError(f"{name}: position {pos} out of range 0..64")
            self.positions[pos] = self.positions.get(pos, 0.0) + value
        elif kind == _SUCCESS:
            reason = labels.get("finished_reason", "unknown")
            self.success[reason] = self.success.get(reason, 0.0) + value
        elif kind == _GEN_BUCKET:
            try:
                le = float(labels["le"])
            except (KeyError, ValueError) as exc:
                raise ExpositionParseError(f"{name}: bad or missing 'le' label") from exc
            self.buckets[le] = self.buckets.get(le, 0.0) + value
        else:
            self.sums[kind] = (self.sums[kind] or 0.0) + value
        if kind in _ENGINE_KINDS:
            eng = labels.get("engine")
            if eng is not None:
                self.engines.add(eng)
            model = labels.get("model_name")
            if model is not None:
                self.models.add(model)

    def snapshot(self, timestamp: float) -> EngineSnapshot:
        sums = self.sums
        hist = None
        if self.buckets:
            bounds = tuple(sorted(self.buckets))
            cum = tuple(self.buckets[b] for b in bounds)
            h_count, h_sum = sums[_GEN_COUNT], sums[_GEN_SUM]
            count = h_count if h_count is not None else self.buckets.get(math.inf, cum[-1])
            hist = GenerationHistogram(bounds=bounds, cumulative=cum, count=count, sum=h_sum or 0.0)
        pos: tuple[float, ...] = ()
        if self.positions:
            pos = tuple(self.positions.get(i, 0.0) for i in range(max(self.positions) + 1))
        drafts, gen_tokens = sums[_DRAFTS], sums[_GEN_TOKENS]
        return EngineSnapshot(
            timestamp=timestamp,
            num_drafts=drafts,
            num_draft_tokens=sums[_DRAFT_TOKENS],
            num_accepted_tokens=sums[_ACCEPTED],
            accepted_per_position=pos,
            generation_tokens=gen_tokens,
            request_success=self.success,
            generation_length=hist,
            num_requests_running=sums[_RUNNING],
            num_requests_waiting=sums[_WAITING],
            prompt_tokens=sums[_PROMPT],
            engine_steps=sums[_STEPS],
            engines=len(self.engines) if self.engines else (1 if (drafts is not None or gen_tokens is not None) else 0),
            model_names=tuple(sorted(self.models)),
            start_time=self.created,
        )


def snapshot_from_samples(samples: Iterable[tuple[str, Mapping[str, str], float]], timestamp: float) -> EngineSnapshot:
    """One pod's samples as ``(name, labels, value)`` (e.g. a Prometheus query's series) → a snapshot, by the
    same rules as :func:`parse_exposition`; names it does not read are ignored."""
    fold = _Fold()
    for name, labels, value in samples:
        base = name[5:] if name.startswith(("vllm:", "vllm_")) else name
        kind = _KINDS.get(base)
        if kind is not None:
            fold.add(kind, name, labels, value)
    return fold.snapshot(timestamp)


class ExpositionReader:
    """Parses expositions like :func:`parse_exposition`, remembering the label sets it has parsed (up to
    :data:`MAX_LABEL_SETS`, then it starts over): a pod's label sets are the same at every scrape, and the
    same across the pods of a model, so a scraper holding one reader parses each set once (~4x cheaper)."""

    __slots__ = ("_labels", "max_label_sets")

    def __init__(self, max_label_sets: int = MAX_LABEL_SETS) -> None:
        self._labels: dict[bytes, dict[str, str]] = {}
        self.max_label_sets = max_label_sets

    def parse(self, body: str | bytes, timestamp: float | None = None) -> EngineSnapshot:
        """See :func:`parse_exposition`."""
        if timestamp is None:
            timestamp = time.time()
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogateescape")
        fold = _Fold()
        known = self._labels
        for raw_name, rest in _SAMPLE_LINE.findall(b"\n" + body):
            labels: Mapping[str, str] = {}
            if rest[:1] == b"{":
                end = rest.rfind(b"}")  # a value or timestamp has no `}`; a label value may
                raw = rest[1:end]
                tail = rest[end + 1 :]
                if end < 0 or tail[:1] not in (b" ", b"\t"):
                    raise ExpositionParseError(f"invalid Prometheus exposition: bad sample line {raw_name + rest[:160]!r}")
                found = known.get(raw)
                if found is None:
                    if len(known) >= self.max_label_sets:
                        known.clear()
                    found = known[raw] = _parse_labels(raw, raw_name + rest)
                labels = found
            else:
                tail = rest
            parts = tail.split()
            try:
                if not 1 <= len(parts) <= 2:
                    raise ValueError(tail)
                value = float(parts[0])
                if len(parts) == 2:
                    float(parts[1])  # a timestamp in milliseconds
            except ValueError as exc:
                raise ExpositionParseError(f"invalid Prometheus exposition: bad value in {raw_name + rest[:160]!r}") from exc
            name = raw_name.decode()
            fold.add(_KINDS[name], name, labels, value)
        return fold.snapshot(timestamp)


def parse_exposition(body: str | bytes, timestamp: float | None = None) -> EngineSnapshot:
    """Parse one vLLM /metrics body into an :class:`EngineSnapshot`.

    ``timestamp`` defaults to ``time.time()``. Raises :class:`ExpositionParseError` if a sample line of
    the families read here is not valid text exposition (lines of other families are not looked at).
    A scraper parsing many bodies holds one :class:`ExpositionReader` instead.
    """
    return ExpositionReader().parse(body, timestamp)
