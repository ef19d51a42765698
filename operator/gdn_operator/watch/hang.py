"""Hang evidence from an engine's log (data/hang-evidence.yaml): supporting evidence for a stall, never a
trigger. Pure and bounded: one counter and the last line per entry.

    h = HangEvidence()
    h.feed_text(block)          # complete lines, any number (the crash watch's log stream feeds it)
    h.summary()                 # "shm-broadcast-wait x2 (last: No available shared memory ... 60 seconds)"

Lines of an entry marked ``after_startup`` count only after the engine logged that it started: vLLM prints
the shared-memory wording during normal start-up compilation as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gdn_operator.datafiles import load_yaml, once

__all__ = ["HangEvidence", "HangRule", "load_rules"]

_MAX_LINE = 400  # characters of a matched line kept


class HangRuleError(ValueError):
    """data/hang-evidence.yaml is malformed; the message names the entry and field."""


@dataclass(frozen=True)
class HangRule:
    id: str
    regex: re.Pattern[str]
    after_startup: bool
    says: str


@dataclass(frozen=True)
class _Rules:
    startup: str
    keywords: tuple[str, ...]
    rules: tuple[HangRule, ...]


def _parse(data: Any, where: str) -> _Rules:
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise HangRuleError(f"{where}: expected a mapping with schema: 1")
    startup, keywords, lines = data.get("startup"), data.get("keywords"), data.get("lines")
    if not isinstance(startup, str) or not startup:
        raise HangRuleError(f"{where}: 'startup' must be the non-empty line that says the engine started")
    if not isinstance(keywords, list) or not keywords or not all(isinstance(k, str) and k for k in keywords):
        raise HangRuleError(f"{where}: 'keywords' must be a non-empty list of strings")
    if not isinstance(lines, dict) or not lines:
        raise HangRuleError(f"{where}: 'lines' must map an id to {{regex, after_startup, says}}")
    rules = []
    for rid, entry in lines.items():
        w = f"{where}: lines.{rid}"
        if not isinstance(entry, dict) or set(entry) != {"regex", "after_startup", "says"}:
            raise HangRuleError(f"{w}: needs exactly regex, after_startup and says")
        try:
            rx = re.compile(entry["regex"])
        except (re.error, TypeError) as e:
            raise HangRuleError(f"{w}.regex: {e}") from e
        if not isinstance(entry["after_startup"], bool) or not isinstance(entry["says"], str):
            raise HangRuleError(f"{w}: after_startup is true/false, says is a string")
        rules.append(HangRule(str(rid), rx, entry["after_startup"], entry["says"]))
    return _Rules(startup, tuple(keywords), tuple(rules))


@once
def load_rules() -> _Rules:
    text = resources.files("gdn_operator.watch").joinpath("data/hang-evidence.yaml").read_text(encoding="utf-8")
    return _parse(load_yaml(text), "hang-evidence.yaml")


class HangEvidence:
    """Counts of each hang wording seen in one container instance's log, and the last line of each."""

    __slots__ = ("_rules", "started", "counts", "last")

    def __init__(self, rules: _Rules | None = None) -> None:
        self._rules = rules or load_rules()
        self.started = False
        self.counts: dict[str, int] = {}
        self.last: dict[str, str] = {}

    def feed_text(self, text: str) -> None:
        """Complete log lines (a block of them)."""
        r = self._rules
        if not self.started and r.startup in text:
            # only what follows the start-up line counts for after_startup entries
            head, _, text = text.partition(r.startup)
            self._scan(head, started=False)
            self.started = True
        self._scan(text, started=self.started)

    def _scan(self, text: str, *, started: bool) -> None:
        if not any(k in text for k in self._rules.keywords):
            return
        for line in text.splitlines():
            if not any(k in line for k in self._rules.keywords):
                continue
            for rule in self._rules.rules:
                if rule.after_startup and not started:
                    continue
                m = rule.regex.search(line)
                if m:
                    self.counts[rule.id] = self.counts.get(rule.id, 0) + 1
                    self.last[rule.id] = line[m.start() :][:_MAX_LINE].strip()

    @property
    def found(self) -> bool:
        return bool(self.counts)

    def summary(self) -> str:
        """One line for a stall's message; empty when nothing was seen."""
        says = {r.id: r.says for r in self._rules.rules}
        parts = []
        for rid, n in sorted(self.counts.items()):
            parts.append(f"{says[rid]} ({'repeated, ' if n > 1 else ''}{n}x, last: {self.last[rid]!r})")
        return "; ".join(parts)
