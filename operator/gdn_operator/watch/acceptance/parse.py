"""Parsing: one Prometheus text exposition of a vLLM engine → one :class:`EngineSnapshot`.

:func:`parse_exposition` sums the counters over the ``engine`` / ``model_name`` label sets of one pod.
Parsing is done by ``prometheus_client.parser.text_string_to_metric_families``; before that, a single
regular expression keeps only the lines of the ~10 metric families we use (a vLLM exposition has ~100
families and ~600 lines; filtering makes a parse ~10x cheaper, which matters when 1000 pods are
scraped every 15 s).

Accepted names (vLLM 0.17 … 0.33, see ../shared/docs/vllm-known-issues.md §6): with or without the
``vllm:`` prefix (``vllm_`` too, for relabelled copies), with or without the ``_total`` suffix that
prometheus_client appends to counters:

``spec_decode_num_drafts``, ``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``,
``spec_decode_num_accepted_tokens_per_pos{position}``, ``generation_tokens``,
``request_success{finished_reason}``, ``request_generation_tokens`` (histogram),
``num_requests_running`` (gauge), and, for the stall detector (``watch/stall.py``), ``prompt_tokens``,
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
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "EngineSnapshot",
    "ExpositionParseError",
    "GenerationHistogram",
    "bucket_key",
    "finished_key",
    "parse_exposition",
    "position_key",
]


class ExpositionParseError(ValueError):
    """The /metrics body is not a valid Prometheus text exposition (for the families we read)."""


# Base names (prefix and `_total` stripped) of what we read.
_DRAFTS = "spec_decode_num_drafts"
_DRAFT_TOKENS = "spec_decode_num_draft_tokens"
_ACCEPTED = "spec_decode_num_accepted_tokens"
_ACCEPTED_POS = "spec_decode_num_accepted_tokens_per_pos"
_GEN_TOKENS = "generation_tokens"
_SUCCESS = "request_success"
_GEN_HIST = "request_generation_tokens"
_RUNNING = "num_requests_running"
_STALL_NAMES = {b"num_requests_waiting": 0, b"prompt_tokens_total": 1, b"iteration_tokens_total_count": 2}

# One regex keeps the sample, HELP and TYPE lines of exactly those families (see module docstring).
# It does not parse anything: the kept lines go to prometheus_client's parser unchanged.
# It starts with a literal newline (the body is searched with one prepended) so that `re` can scan for
# line starts quickly: ~0.1 ms on a 55 KB exposition instead of ~0.35 ms with a MULTILINE `^`.
_LINE_FILTER = re.compile(
    rb"\n(?:((?:# (?:HELP|TYPE) )?(?:vllm[:_])?(?:"
    rb"spec_decode_num_(?:drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)(?:_total)?"
    rb"|spec_decode_num_drafts_created"
    rb"|generation_tokens(?:_total|_created)?"
    rb"|request_success(?:_total)?"
    rb"|request_generation_tokens(?:_bucket|_count|_sum)?"
    rb"|num_requests_running"
    rb")[ {\t][^\n]*)"
    # second group: the stall detector's families, sample lines only, read by _stall_samples (three more
    # lines through prometheus_client would cost as much again as the detector itself)
    rb"|((?:vllm[:_])?(?:num_requests_waiting|prompt_tokens_total|iteration_tokens_total_count)[ {\t][^\n]*))"
)


def _stall_samples(lines: list[bytes]) -> tuple[float | None, float | None, float | None]:
    """(waiting, prompt tokens, engine steps) summed over engines from those families' sample lines,
    ``name{labels} value`` (vLLM writes no timestamp)."""
    out: list[float | None] = [None, None, None]
    for line in lines:
        name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        if name[:5] in (b"vllm:", b"vllm_"):
            name = name[5:]
        try:
            value = float(line.rsplit(b"}", 1)[-1].split()[0])
        except (ValueError, IndexError) as exc:
            raise ExpositionParseError(f"invalid sample line {line[:120]!r}") from exc
        i = _STALL_NAMES[name]
        out[i] = (out[i] or 0.0) + value
    return out[0], out[1], out[2]


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


def _base_name(name: str) -> str:
    if name.startswith("vllm:") or name.startswith("vllm_"):
        name = name[5:]
    return name


def parse_exposition(body: str | bytes, timestamp: float | None = None) -> EngineSnapshot:
    """Parse one vLLM /metrics body into an :class:`EngineSnapshot`.

    ``timestamp`` defaults to ``time.time()``. Raises :class:`ExpositionParseError` if the text is
    not a valid exposition for the families read here (lines of other families are not looked at).
    """
    if timestamp is None:
        timestamp = time.time()
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    found = _LINE_FILTER.findall(b"\n" + body)
    if not found:
        return EngineSnapshot(timestamp=timestamp)
    kept = [a for a, _ in found if a]
    waiting, prompt, steps = _stall_samples([b for _, b in found if b])
    try:
        text = b"\n".join(kept).decode("utf-8")
        families = list(text_string_to_metric_families(text + "\n"))
    except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise ExpositionParseError(f"invalid Prometheus exposition: {exc}") from exc

    drafts = draft_tokens = accepted = gen_tokens = running = None
    positions: dict[int, float] = {}
    success: dict[str, float] = {}
    buckets: dict[float, float] = {}
    h_count = h_sum = None
    engines: set[str] = set()
    models: set[str] = set()
    created: float | None = None

    for fam in families:
        for s in fam.samples:
            name = _base_name(s.name)
            labels = s.labels
            value = s.value
            if name.endswith("_total"):
                name = name[:-6]
            elif name.endswith("_created"):
                if created is None or value < created:
                    created = value
                continue
            if name == _DRAFTS:
                drafts = (drafts or 0.0) + value
            elif name == _DRAFT_TOKENS:
                draft_tokens = (draft_tokens or 0.0) + value
            elif name == _ACCEPTED:
                accepted = (accepted or 0.0) + value
            elif name == _ACCEPTED_POS:
                try:
                    pos = int(labels["position"])
                except (KeyError, ValueError) as exc:
                    raise ExpositionParseError(f"{s.name}: label 'position' missing or not an integer ({labels})") from exc
                if pos < 0 or pos > 64:
                    raise ExpositionParseError(f"{s.name}: position {pos} out of range 0..64")
                positions[pos] = positions.get(pos, 0.0) + value
            elif name == _GEN_TOKENS:
                gen_tokens = (gen_tokens or 0.0) + value
            elif name == _SUCCESS:
                reason = labels.get("finished_reason", "unknown")
                success[reason] = success.get(reason, 0.0) + value
            elif name == _GEN_HIST + "_bucket":
                try:
                    le = float(labels["le"])
                except (KeyError, ValueError) as exc:
                    raise ExpositionParseError(f"{s.name}: bad or missing 'le' label") from exc
                buckets[le] = buckets.get(le, 0.0) + value
            elif name == _GEN_HIST + "_count":
                h_count = (h_count or 0.0) + value
            elif name == _GEN_HIST + "_sum":
                h_sum = (h_sum or 0.0) + value
            elif name == _RUNNING:
                running = (running or 0.0) + value
            else:
                continue
            eng = labels.get("engine")
            if eng is not None:
                engines.add(eng)
            model = labels.get("model_name")
            if model is not None:
                models.add(model)

    hist = None
    if buckets:
        bounds = tuple(sorted(buckets))
        cum = tuple(buckets[b] for b in bounds)
        count = h_count if h_count is not None else (buckets.get(math.inf, cum[-1]))
        hist = GenerationHistogram(bounds=bounds, cumulative=cum, count=count, sum=h_sum or 0.0)

    pos_tuple: tuple[float, ...] = ()
    if positions:
        pos_tuple = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1))

    return EngineSnapshot(
        timestamp=timestamp,
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_position=pos_tuple,
        generation_tokens=gen_tokens,
        request_success=success,
        generation_length=hist,
        num_requests_running=running,
        num_requests_waiting=waiting,
        prompt_tokens=prompt,
        engine_steps=steps,
        engines=len(engines) if engines else (1 if (drafts is not None or gen_tokens is not None) else 0),
        model_names=tuple(sorted(models)),
        start_time=created,
    )
