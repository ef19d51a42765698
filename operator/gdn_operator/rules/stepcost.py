"""MTP's worth from measured step costs: tokens per step at a given acceptance, and the speed-up over MTP off.

A decode step with MTP k verifies k drafted tokens plus one (a "verify-(k+1)" step) and emits, per request,
1 + a1 + a1*a2 + ... tokens, where ai is the conditional acceptance of draft position i (vLLM's per-position
counters, ``vllm:spec_decode_num_accepted_tokens_per_pos_total / num_drafts``, are already the unconditional
products a1, a1*a2, ...). With the step cost t_k of that step and t_off of a step without MTP, MTP's
speed-up is ``(1 + sum(per_position)) * t_off / t_k``. Step costs come from engines with dummy weights at a real
model geometry (acceptance there is whatever random weights give, so the inter-token gap divided by tokens per
step IS the step cost); acceptance comes from a trained model or a published figure (issue 50).

Pure and stdlib-only: bench/bench_gpu_stepcost.py loads this file by path on the GPU host.
"""

from __future__ import annotations

from collections.abc import Sequence

#: the acceptance grid of a speed-up curve (constant conditional acceptance per position)
GRID: tuple[float, ...] = tuple(round(i / 20, 2) for i in range(21))


def tokens_per_step(per_position: Sequence[float]) -> float:
    """Mean tokens emitted per request per step: 1 + the unconditional acceptance of each draft position."""
    if any(not 0.0 <= p <= 1.0 for p in per_position):
        raise ValueError(f"per-position acceptance must lie in [0, 1]: {list(per_position)}")
    if any(b > a + 1e-9 for a, b in zip(per_position, per_position[1:], strict=False)):
        raise ValueError(f"unconditional per-position acceptance cannot grow with the position: {list(per_position)}")
    return 1.0 + sum(per_position)


def constant(alpha: float, k: int) -> list[float]:
    """Unconditional per-position acceptance for a constant conditional acceptance `alpha` at every position."""
    if not 0.0 <= alpha <= 1.0 or k < 1:
        raise ValueError(f"alpha in [0, 1] and k >= 1 needed, got {alpha}, {k}")
    return [alpha**i for i in range(1, k + 1)]


def speedup(t_off: float, t_k: float, per_position: Sequence[float]) -> float:
    """Tokens/s of MTP over tokens/s of MTP off, per request (one step per request at a time)."""
    if t_off <= 0 or t_k <= 0:
        raise ValueError(f"step costs must be positive, got t_off={t_off}, t_k={t_k}")
    return tokens_per_step(per_position) * t_off / t_k


def break_even(t_off: float, t_k: float, k: int) -> float | None:
    """The constant conditional acceptance at which MTP k equals MTP off (0.0 when it never loses, None when even
    full acceptance loses). Bisection: the speed-up grows with alpha."""
    if speedup(t_off, t_k, constant(0.0, k)) >= 1.0:
        return 0.0
    if speedup(t_off, t_k, constant(1.0, k)) < 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if speedup(t_off, t_k, constant(mid, k)) >= 1.0:
            hi = mid
        else:
            lo = mid
    return round(hi, 4)


def curve(t_off: float, t_k: float, k: int, grid: Sequence[float] = GRID) -> list[list[float]]:
    """[[alpha, speed-up], ...] at constant conditional acceptance alpha (speed-ups rounded to 3 decimals)."""
    return [[a, round(speedup(t_off, t_k, constant(a, k)), 3)] for a in grid]
