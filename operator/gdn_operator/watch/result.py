"""What the classifier reports: ClassificationResult (JSON-serialisable) and best_result()."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from gdn_operator.watch.catalogue import Remedy


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
    remediation: Remedy | None = None
    other_signatures: list[str] = field(default_factory=list)
    context: list[str] = field(default_factory=list)
    lines_scanned: int = 0
    #: upstream issues this crash may be, not named because the evidence that ties them is missing
    candidates: list[str] = field(default_factory=list)
    #: why a candidate was not named (one line per candidate)
    attribution: list[str] = field(default_factory=list)
    #: facts used for attribution: fact -> "value (log|spec|--vllm-version)"
    evidence: dict[str, str] = field(default_factory=dict)
    #: the vLLM releases `upstream` holds for, when neither the log nor the spec gives the version (issue 47)
    upstream_if_versions: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def summary(self) -> str:
        """One line for a Kubernetes Event / status message."""
        if not self.crashed:
            return "no crash signature found"
        up = f" ({self.upstream})" if self.upstream else ""
        if self.upstream and self.upstream_if_versions:
            up = f" ({self.upstream} if vLLM {self.upstream_if_versions}; the log does not give the version)"
        cand = f" (candidates, not confirmed: {', '.join(self.candidates)})" if self.candidates and not self.upstream else ""
        rc = f": {self.root_cause}" if self.root_cause else ""
        return f"{self.signature}{up}{cand}{rc}"


def best_result(*results: ClassificationResult | None) -> ClassificationResult:
    """The most informative of several results (e.g. termination message vs. streamed log).

    Crashed beats not crashed, specific beats generic, then higher priority, then a root cause present.
    """
    rs = [r for r in results if r is not None]
    if not rs:
        return ClassificationResult(crashed=False)
    return max(rs, key=lambda r: (r.crashed, not r.generic, r.priority, r.root_cause is not None))
