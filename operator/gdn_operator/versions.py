"""vLLM version parsing and version ranges: the known-crash rules, the option tables (api/vllm_args.py),
the renderer's version-gated features and the crash catalogue all compare versions with these.

Versions are parsed by `packaging` (PEP 440) and ordered the PEP 440 way: ``0.19.2rc1.dev226+g53b9640fb``
is a pre-release of 0.19.2 and sorts before 0.19.2rc1, which sorts before 0.19.2. A leading ``v`` (image
tags such as ``v0.33.0``) is accepted. Local labels (``+g53b9640fb``, ``+cu129``) are kept for display but,
unlike in `packaging`, do not affect ordering; epochs (``1!0.1``, no vLLM release has one) and releases of
more than six parts are refused.

A range (the rule file's ``versions`` field) is a comma-separated conjunction of clauses such as
``<=0.17.1`` or ``>=0.25.0,<0.29.0``; ``*`` means every version. Pre-releases are compared like any other
version, so ``<0.18.0`` includes ``0.18.0rc1`` (a nightly before a fix release is not assumed to carry
the fix). That is why ranges are ours and not `packaging.specifiers`: PEP 440 keeps ``0.18.0rc1`` out of
``<0.18.0``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from packaging import version as pep440

#: packaging's normalised pre-release labels, ranked
_PRE_RANK = {"a": 1, "b": 2, "rc": 3}
_PRE_CANON = {1: "a", 2: "b", 3: "rc"}
_NO_DEV = 1 << 62

#: Version.key: (release without trailing zeros, pre-release rank, post or -1, dev or _NO_DEV)
VersionKey = tuple[tuple[int, ...], tuple[int, int], int, int]


class Version:
    """A parsed vLLM version. Compare with <, <=, ==; `key` is the total order."""

    __slots__ = ("text", "release", "pre", "post", "dev", "local", "key")

    def __init__(
        self,
        text: str,
        release: tuple[int, ...],
        pre: tuple[int, int] | None,
        post: int | None,
        dev: int | None,
        local: str | None,
    ):
        self.text = text
        self.release = release
        self.pre = pre
        self.post = post
        self.dev = dev
        self.local = local
        rel = list(release)
        while len(rel) > 1 and rel[-1] == 0:
            rel.pop()
        if pre is None and post is None and dev is not None:
            pre_key = (0, 0)  # X.Y.Z.devN sorts before X.Y.ZaN
        elif pre is None:
            pre_key = (4, 0)
        else:
            pre_key = pre
        self.key: VersionKey = (tuple(rel), pre_key, -1 if post is None else post, _NO_DEV if dev is None else dev)

    # ordering --------------------------------------------------------------------------------
    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    def __le__(self, other: Version) -> bool:
        return self.key <= other.key

    def __gt__(self, other: Version) -> bool:
        return self.key > other.key

    def __ge__(self, other: Version) -> bool:
        return self.key >= other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    # description -----------------------------------------------------------------------------
    @property
    def base(self) -> str:
        """The release this version belongs to, e.g. 0.19.2 for 0.19.2rc1.dev226+g53b9640fb."""
        rel = list(self.release) + [0] * (3 - len(self.release))
        return ".".join(str(p) for p in rel)

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def canonical(self) -> str:
        out = self.base
        if self.pre is not None:
            out += f"{_PRE_CANON[self.pre[0]]}{self.pre[1]}"
        if self.post is not None:
            out += f".post{self.post}"
        if self.dev is not None:
            out += f".dev{self.dev}"
        if self.local:
            out += f"+{self.local}"
        return out

    def __str__(self) -> str:
        return self.canonical

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


def parse_version(text: object) -> Version | None:
    """Parse a vLLM version; None when it is not a version (e.g. 'latest', '', 'nightly')."""
    if not isinstance(text, str) or len(text) > 128:
        return None
    return _parse_cached(text)


def require_version(text: str) -> Version:
    """Parse a version the code itself states (a constant, a table's file name): raise if it is not one."""
    version = parse_version(text)
    if version is None:
        raise ValueError(f"{text!r} is not a vLLM version")
    return version


@functools.lru_cache(maxsize=512)
def _parse_cached(text: str) -> Version | None:
    try:
        v = pep440.Version(text)
    except pep440.InvalidVersion:
        return None
    if v.epoch or len(v.release) > 6:
        return None
    pre = (_PRE_RANK[v.pre[0]], v.pre[1]) if v.pre is not None else None
    # the local label as written (lowercased): packaging normalises its separators to "."
    local = text.strip().split("+", 1)[1].lower() if v.local is not None else None
    return Version(text.strip(), v.release, pre, v.post, v.dev, local)


_CLAUSE_RE = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")
_OPS: dict[str, Callable[[VersionKey, VersionKey], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class VersionRange:
    """A conjunction of version clauses, e.g. ``>=0.25.0,<0.29.0``; ``*`` = all versions."""

    __slots__ = ("text", "clauses", "lower", "upper")

    def __init__(self, text: str):
        self.text = text.strip()
        self.clauses: list[tuple[str, Version]] = []
        if self.text in ("*", ""):
            return
        for part in self.text.split(","):
            m = _CLAUSE_RE.match(part)
            if not m:
                raise ValueError(f"bad version clause {part.strip()!r} (use e.g. '<=0.17.1' or '>=0.25.0,<0.29.0' or '*')")
            v = parse_version(m.group(2))
            if v is None:
                raise ValueError(f"bad version {m.group(2)!r} in clause {part.strip()!r}")
            self.clauses.append((m.group(1), v))

    @property
    def is_open_ended(self) -> bool:
        """True when no clause bounds the range from above (an open bug)."""
        return not any(op in ("<", "<=", "==") for op, _ in self.clauses)

    def contains(self, v: Version) -> bool:
        return self.contains_key(v.key)

    def contains_key(self, key: VersionKey) -> bool:
        """`contains` for a version's sort key (Version.key), as the rule predicates carry it."""
        return all(_OPS[op](key, bound.key) for op, bound in self.clauses)

    def __str__(self) -> str:
        return self.text or "*"
