"""Output probes API: `spec.probes` (known-answer requests the operator sends to every Ready engine pod)
and `status.probes` (what they answered). Part of the GDNModelServer API (api/spec.py, api/status.py); the CRD is
generated from these models like everything else.

The comparison itself lives in watch/probes.py; the probing loop in handlers/engines/probes.py.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from gdn_operator.api.base import _Model, _Status

#: `expected: learn` — the reference is the first answer of a freshly Ready engine of the current generation.
LEARN = "learn"
#: Prefix length (tokens) compared by default when the reference is learned.
DEFAULT_LEARN_PREFIX = 8
MAX_PROBE_TOKENS = 128

_MODE = re.compile(r"^(exact|prefix|prefix:[1-9][0-9]{0,2}|minLength:[1-9][0-9]{0,2})$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

_TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class Probe(_Model):
    """One known-answer request, sent greedily (temperature 0) to each Ready engine pod every interval."""

    name: str = Field(
        min_length=1,
        max_length=63,
        json_schema_extra={"pattern": _NAME.pattern},
        description="Probe name (lowercase letters, digits, '-'); unique within spec.probes.prompts. A metric label.",
    )
    prompt: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="Prompt text (/v1/completions, no chat template). Set this or promptTokenIds.",
    )
    prompt_token_ids: list[_TokenId] | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Prompt as token ids, for models served without a tokenizer. Set this or prompt.",
    )
    max_tokens: int = Field(
        default=16,
        ge=1,
        le=MAX_PROBE_TOKENS,
        description="Tokens to generate (greedy). Probe traffic per round is (prompt + maxTokens) tokens per probe per pod.",
    )
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=4, description="Stop strings (needs a tokenizer in the engine)."
    )
    expected: str = Field(
        default=LEARN,
        min_length=1,
        max_length=2048,
        description=(
            "The expected continuation (text), or `learn`: the first answer of a freshly Ready engine of the "
            "current spec generation and image becomes the reference (kept in status.probes.reference, "
            "re-learned on every new generation and after every remediation override). Use expectedTokenIds "
            "to give the answer as token ids."
        ),
    )
    expected_token_ids: list[_TokenId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PROBE_TOKENS,
        description="The expected continuation as token ids (instead of expected text).",
    )
    mode: str | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={"pattern": _MODE.pattern},
        description=(
            "How to compare: `exact` (the whole answer), `prefix` (the expectation is a prefix of the answer), "
            "`prefix:N` (the first N tokens; token expectations or learn), `minLength:N` (only: did it produce at "
            f"least N tokens, i.e. not stop early). Default: exact for a given expectation, prefix:{DEFAULT_LEARN_PREFIX} "
            "(at most maxTokens) for learn."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} must be lowercase letters, digits and '-' (e.g. capital-of-france)")
        return v

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str | None) -> str | None:
        if v is not None and not _MODE.match(v):
            raise ValueError(f"{v!r} must be exact, prefix, prefix:N or minLength:N (N = 1..999 tokens)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Probe:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError(f"probe {self.name!r}: set exactly one of prompt and promptTokenIds")
        if self.expected_token_ids is not None and self.expected != LEARN:
            raise ValueError(f"probe {self.name!r}: set either expected (text) or expectedTokenIds, not both")
        if self.expected_token_ids is not None and len(self.expected_token_ids) > self.max_tokens:
            raise ValueError(
                f"probe {self.name!r}: expectedTokenIds has {len(self.expected_token_ids)} tokens but maxTokens is "
                f"{self.max_tokens}; raise maxTokens or shorten the expectation"
            )
        kind, n = self.comparison
        if n is not None and n > self.max_tokens:
            raise ValueError(f"probe {self.name!r}: mode {self.mode} compares {n} tokens but maxTokens is {self.max_tokens}")
        if kind == "prefix" and n is not None and self.expects_text:
            raise ValueError(
                f"probe {self.name!r}: mode prefix:{n} counts tokens; with a text expectation use mode prefix "
                "(the text must begin the answer) or give expectedTokenIds"
            )
        return self

    @property
    def learns(self) -> bool:
        return self.expected == LEARN and self.expected_token_ids is None

    @property
    def expects_text(self) -> bool:
        return not self.learns and self.expected_token_ids is None

    @property
    def comparison(self) -> tuple[str, int | None]:
        """(kind, N): kind in exact / prefix / minLength; N None for exact and plain prefix."""
        mode = self.mode
        if mode is None:
            mode = f"prefix:{min(DEFAULT_LEARN_PREFIX, self.max_tokens)}" if self.learns else "exact"
        kind, _, n = mode.partition(":")
        return kind, (int(n) if n else None)


class ProbesSpec(_Model):
    """Output probes: ask every Ready engine questions whose answers are known, to catch silent corruption
    (garbled text, early EOS) that neither crashes the engine nor shows in its metrics."""

    enabled: bool = Field(default=True, description="Send the probes (false keeps the configuration but stops probing).")
    interval_seconds: int = Field(default=60, ge=5, le=3600, description="Seconds between probe rounds (jittered by ±10%).")
    timeout_seconds: int = Field(default=10, ge=1, le=300, description="Deadline of one probe request.")
    failure_threshold: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive failing rounds of one probe before OutputConsistent turns False (one blip never alarms).",
    )
    prompts: list[Probe] = Field(min_length=1, max_length=8, description="The probes (at most 8).")

    @model_validator(mode="after")
    def _check(self) -> ProbesSpec:
        names = [p.name for p in self.prompts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(dup)}")
        if self.timeout_seconds >= self.interval_seconds:
            raise ValueError(f"timeoutSeconds ({self.timeout_seconds}) must be below intervalSeconds ({self.interval_seconds})")
        return self


# ---------------------------------------------------------------------------------------- status ---


class ProbeAnswer(_Status):
    """A learned reference answer."""

    probe: str
    token_ids: list[int] | None = Field(default=None, description="Generated token ids (when the engine returns them).")
    text: str = Field(default="", description="Generated text (first 512 characters).")
    finish_reason: str | None = None


class ProbeReference(_Status):
    """What `expected: learn` probes compare with: learned from a freshly Ready engine."""

    generation: int | None = Field(default=None, description="Spec generation the answers were learned on.")
    revision: str | None = Field(default=None, description="Generation + remediation overrides in force they were learned on.")
    image: str | None = Field(default=None, description="Engine image the answers were learned from.")
    pod: str | None = None
    learned_at: str | None = None
    answers: list[ProbeAnswer] = Field(default_factory=list, max_length=8)


class ProbeFailure(_Status):
    time: str | None = None
    pod: str | None = None
    result: str = Field(description="mismatch, early-stop or error.")
    cause: str | None = Field(
        default=None, description="Errors: auth (HTTP 401/403), connect, timeout, http, parse — why no answer came."
    )
    position: int | None = Field(default=None, description="First differing token (or character) of the answer.")
    expected: str | None = Field(default=None, description="A few expected tokens from that position (never the whole answer).")
    got: str | None = Field(default=None, description="A few answered tokens from that position.")
    message: str = ""


class ProbeResult(_Status):
    probe: str
    last_result: str | None = Field(default=None, description="pass, learned, mismatch, early-stop or error.")
    consecutive_failures: int = 0
    last_failure: ProbeFailure | None = None
    last_wrong_answer: ProbeFailure | None = Field(
        default=None,
        description="The wrong answer of the current failing streak when later rounds got no answer (the alarm stays "
        "an inconsistency).",
    )


class ProbeDiagnosis(_Status):
    """A known silent-corruption rule admitted under `warn` that matches this server's configuration."""

    rules: list[str] = Field(default_factory=list, description="Rule ids, e.g. vllm#51508.")
    message: str = ""


class ProbesStatus(_Status):
    """Output probe results (status.probes)."""

    state: str | None = Field(
        default=None,
        description="Learning, Consistent, Inconsistent, Failing (below failureThreshold), NoAnswer (no answer for "
        "failureThreshold rounds: OutputConsistent Unknown), NoReadyEngines.",
    )
    generation: int | None = Field(default=None, description="Spec generation the counts below belong to.")
    revision: str | None = Field(
        default=None, description="Generation + remediation overrides in force the counts belong to (api/overrides.revision)."
    )
    pods_probed: int | None = None
    pods_skipped: int | None = Field(default=None, description="Ready pods not probed: running a previous spec (rollout).")
    reference: ProbeReference | None = None
    results: list[ProbeResult] = Field(default_factory=list, max_length=8)
    diagnosis: ProbeDiagnosis | None = None
