"""The release in an image tag, read with a pattern a GDNGuard's author wrote (spec.vllmVersion.imageTag.pattern):
matched by RE2, never by Python's backtracking `re` (issue 48).

A user's regular expression runs in the operator's process on every guarded workload's image tag. Python's `re`
backtracks: `^(?:a+)+(b)` against 30 `a`s took 10 s, ×4 for every two characters more, so one namespace's user
could spend the operator's CPU and time out admission for everyone. RE2 (the engine Kubernetes' own CEL `matches`,
Kyverno and Gatekeeper use, through Go's regexp) matches in time linear in the tag, whatever the pattern, and
refuses what it cannot bound: backreferences, lookaround, possessive quantifiers. Its program is held to
MAX_PROGRAM_BYTES of memory; an image tag is at most TAG_MAX_CHARS characters (the OCI distribution spec).

The API server checks the same syntax at admission of the guard (the CRD's CEL rule compiles the pattern with its
RE2, api/guard.py), so a pattern the operator would refuse never reaches it; `compile_tag_pattern` gives the
message naming the field and the fix for gdnctl and the guard's status.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

#: the longest image tag there is (OCI distribution spec: [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})
TAG_MAX_CHARS = 128
#: the memory RE2 may give one compiled pattern (a 256-character pattern needs far less; RE2 refuses a pattern
#: whose program would need more, e.g. a{1000}{1000})
MAX_PROGRAM_BYTES = 1 << 20
FIELD = "spec.vllmVersion.imageTag.pattern"
EXAMPLE = r"'^v?([0-9]+\.[0-9]+\.[0-9]+)-cu12'"


@functools.cache
def _re2() -> Any:
    """google-re2, imported the first time a guard's pattern is compiled, not when this module is: rendering a
    GDNModelServer (`gdnctl render`, which tests/gpu/harness.py runs with a GPU host's own Python packages) never
    compiles one, and a host without google-re2 can still render. Not a fallback: without it a pattern is refused."""
    return importlib.import_module("re2")


def _options() -> Any:
    re2 = _re2()
    o = re2.Options()
    o.log_errors = False  # the error comes back as the exception (RE2 would also print it on stderr)
    o.max_mem = MAX_PROGRAM_BYTES
    return o


class TagPattern:
    """A compiled tag pattern with exactly one capturing group (the release)."""

    def __init__(self, compiled: Any) -> None:
        self._re = compiled

    def release(self, tag: str) -> str | None:
        """The first group of the first match in `tag` (None: no match, or an empty group). Linear in the tag."""
        m = self._re.search(tag[:TAG_MAX_CHARS])
        return (m.group(1) or None) if m else None


@functools.lru_cache(maxsize=256)
def compile_tag_pattern(pattern: str) -> TagPattern:
    """The pattern compiled by RE2; ValueError naming the field and the fix when RE2 refuses it or it does not
    have exactly one capturing group."""
    re2 = _re2()
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"{FIELD} {pattern!r} is not an RE2 regular expression ({why}): patterns are matched by RE2 (the syntax "
            f"of Go's regexp and Kubernetes CEL), which has no backreferences or lookaround; write one group that "
            f"captures the release, e.g. {EXAMPLE}"
        ) from None
    if compiled.groups != 1:
        raise ValueError(
            f"{FIELD} {pattern!r} has {compiled.groups} groups: it needs exactly one, capturing the release "
            f"(e.g. {EXAMPLE}; make other groups non-capturing: (?:...))"
        )
    return TagPattern(compiled)
