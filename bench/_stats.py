"""Shared by the benchmark scripts (run as `python bench/<name>.py`, so this directory is on sys.path)."""

from __future__ import annotations


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank on the sorted sample); NaN for an empty sample."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]
