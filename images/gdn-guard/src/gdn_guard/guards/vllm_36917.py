"""Guard for vllm#36917 (also #34845, #36122): GDN mixed decode / spec-decode batch assertion.

Mechanism (vLLM <= 0.17.1, catalogue B1): with a Gated DeltaNet hybrid model and MTP speculative
decoding, the GPU model runner marks a batch row as a spec-decode row when the request has draft
tokens scheduled; every other row with exactly one scheduled token is counted as a plain decode.
``GDNAttentionMetadataBuilder.build`` asserts that a step never has both
(``AssertionError: num_decodes: N, num_spec_decodes: M``), so EngineCore dies as soon as the scheduler
puts a one-token non-spec row (a request clipped one token short of ``max_model_len``, the last
one-token chunk of a chunked prefill, a one-token prompt) into the same step as spec-decode rows.
vLLM 0.18.0 reclassifies such rows as prefills inside the builder (PR #34871); closed PR #36918
proposed instead to disable drafts for the whole step in the scheduler.

This guard takes the scheduler-side approach, written for this project: it wraps
``Scheduler.schedule`` (general plugins are loaded by EngineCore before the scheduler is built,
catalogue §7) and, when a finished step mixes the two row kinds, withdraws the draft tokens of that
step.  Each spec row then schedules exactly its one verified token, which is the same state the
scheduler itself produces for a request whose token budget runs out after one token (so the
runner, the drafter and ``update_from_output`` already handle it).  The bookkeeping that
``schedule()`` did for the withdrawn drafts is undone: ``num_scheduled_tokens``,
``total_num_scheduled_tokens``, ``request.num_computed_tokens`` and (async scheduling only) the
output placeholders added for them.  Drafts are proposed again after the step, so only this one
step runs without speculation.

It is armed per scheduler instance, on the first ``schedule()`` call, only when speculative decoding
is on and a KV-cache group is a Mamba spec of type ``gdn_attention`` (the layer type that routes to
``gdn_attn.py``); a KV connector (P/D disaggregation) disables it, because connector metadata is
built inside ``schedule()`` from the unguarded step.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from gdn_guard.guards import Guard, GuardUnavailable
from gdn_guard.versions import VersionRange

logger = logging.getLogger("vllm.gdn_guard")

NAME = "spec-decode-uniform-batch"
PATCH_ID = "gdn-guard/vllm-36917"
MARK = "__gdn_guard_vllm_36917__"  # set on the wrapper function: makes apply() idempotent
STATE_ATTR = "_gdn_guard_vllm_36917"  # per-scheduler state (SchedulerGuardState)

# Architectures whose linear-attention layers are GDN (catalogue §0); only used when the scheduler
# has no KV-cache config to inspect.
GDN_ARCHITECTURES = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
    }
)
GDN_MAMBA_TYPE = "gdn_attention"

# Attributes of the scheduler / its output / requests that the step rewrite reads or writes.
# Checked on arming: a vLLM whose scheduler lacks them is left unguarded (with an error line).
SCHEDULER_ATTRS = ("requests", "running", "kv_cache_config")
OUTPUT_ATTRS = ("num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_spec_decode_tokens")
REQUEST_ATTRS = ("num_computed_tokens", "num_output_placeholders")


@dataclass
class SchedulerGuardState:
    armed: bool
    reason: str
    steps_rewritten: int = 0
    drafts_withdrawn: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(frozen=True)
class StepRewrite:
    """What :func:`make_step_uniform` changed in one step."""

    lone_rows: tuple[str, ...]  # one-token non-spec rows that made the step mixed
    withdrawn: dict[str, int]  # request id -> number of draft tokens withdrawn


# ---------------------------------------------------------------------------------------------
# Detection


def _iter_specs(spec: Any):
    yield spec
    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs wraps per-layer specs
    if isinstance(inner, dict):
        for s in inner.values():
            yield from _iter_specs(s)


def has_gdn_layers(scheduler: Any) -> tuple[bool, str]:
    """Whether the scheduler serves a model with GDN layers, and how that was decided."""
    kv_cfg = getattr(scheduler, "kv_cache_config", None)
    groups = getattr(kv_cfg, "kv_cache_groups", None)
    if groups:
        for group in groups:
            for spec in _iter_specs(getattr(group, "kv_cache_spec", None)):
                if getattr(spec, "mamba_type", None) == GDN_MAMBA_TYPE:
                    return True, f"KV-cache group of mamba_type {GDN_MAMBA_TYPE!r}"
        return False, f"no KV-cache group of mamba_type {GDN_MAMBA_TYPE!r}"
    model_cfg = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
    archs = set(getattr(model_cfg, "architectures", None) or ())
    if archs & GDN_ARCHITECTURES:
        return True, f"architecture {sorted(archs & GDN_ARCHITECTURES)[0]}"
    return False, f"architectures {sorted(archs) or 'unknown'} are not GDN hybrids"


def num_spec_tokens(scheduler: Any) -> int:
    n = getattr(scheduler, "num_spec_tokens", None)
    if n is None:
        spec_cfg = getattr(getattr(scheduler, "vllm_config", None), "speculative_config", None)
        n = getattr(spec_cfg, "num_speculative_tokens", 0) if spec_cfg is not None else 0
    return int(n or 0)


def decide(scheduler: Any) -> SchedulerGuardState:
    """Arm the guard for this scheduler instance or say why not."""
    k = num_spec_tokens(scheduler)
    if k <= 0:
        return SchedulerGuardState(False, "speculative decoding is off")
    gdn, why = has_gdn_layers(scheduler)
    if not gdn:
        return SchedulerGuardState(False, why)
    if getattr(scheduler, "connector", None) is not None or getattr(scheduler, "ec_connector", None) is not None:
        return SchedulerGuardState(False, "a KV/EC connector is configured (its metadata is built inside schedule())")
    missing = [a for a in SCHEDULER_ATTRS if not hasattr(scheduler, a)]
    if missing:
        return SchedulerGuardState(False, f"scheduler lacks {', '.join(missing)}")
    return SchedulerGuardState(True, f"{why}, {k} speculative tokens")


# ---------------------------------------------------------------------------------------------
# The step rewrite


def find_lone_rows(output: Any) -> tuple[str, ...]:
    """Rows the 0.17.x GDN builder counts as plain decodes while spec rows exist: one scheduled
    token and no scheduled drafts.  Empty when the step is already uniform."""
    spec = output.scheduled_spec_decode_tokens
    if not spec or not any(len(d) for d in spec.values()):
        return ()
    return tuple(rid for rid, n in output.num_scheduled_tokens.items() if n == 1 and rid not in spec)


def make_step_uniform(scheduler: Any, output: Any, placeholders_before: dict[str, int]) -> StepRewrite | None:
    """Withdraw this step's draft tokens if the step mixes spec rows with one-token non-spec rows.

    ``placeholders_before`` maps request id -> ``num_output_placeholders`` before ``schedule()``
    ran; it tells whether the scheduler added output placeholders for the drafts (async
    scheduling adds ``1 + len(drafts)``; the synchronous scheduler adds none).  Returns None when
    the step is left as it is.  Raises GuardUnavailable, before changing anything, when the
    bookkeeping does not look as expected."""
    lone = find_lone_rows(output)
    if not lone:
        return None
    spec = output.scheduled_spec_decode_tokens
    plan: list[tuple[str, Any, int, bool]] = []
    for rid, drafts in spec.items():
        k = len(drafts)
        if k == 0:
            continue
        req = scheduler.requests.get(rid)
        if req is None:
            raise GuardUnavailable(f"request {rid} has drafts but is not in scheduler.requests")
        n = output.num_scheduled_tokens.get(rid, 0)
        if n <= k:
            raise GuardUnavailable(f"request {rid}: {n} scheduled tokens for {k} drafts")
        added = req.num_output_placeholders - placeholders_before.get(rid, req.num_output_placeholders)
        if added == 1 + k:
            undo_placeholders = True
        elif added == 0:
            undo_placeholders = False
        else:
            raise GuardUnavailable(f"request {rid}: output placeholders grew by {added} for {k} drafts (expected 0 or {k + 1})")
        if req.num_computed_tokens < k:
            raise GuardUnavailable(f"request {rid}: num_computed_tokens {req.num_computed_tokens} < {k}")
        plan.append((rid, req, k, undo_placeholders))

    withdrawn: dict[str, int] = {}
    for rid, req, k, undo_placeholders in plan:
        output.num_scheduled_tokens[rid] -= k
        output.total_num_scheduled_tokens -= k
        req.num_computed_tokens -= k
        if undo_placeholders:
            req.num_output_placeholders -= k
        withdrawn[rid] = k
    spec.clear()
    return StepRewrite(lone_rows=lone, withdrawn=withdrawn)


def _wrap_schedule(original):
    def schedule(self, *args, **kwargs):
        state = self.__dict__.get(STATE_ATTR)
        if state is None:
            state = decide(self)
            self.__dict__[STATE_ATTR] = state
            logger.info(
                "gdn-guard %s (vllm#36917): %s for this scheduler: %s",
                NAME,
                "armed" if state.armed else "not armed",
                state.reason,
            )
        if not state.armed:
            return original(self, *args, **kwargs)
        before = {r.request_id: r.num_output_placeholders for r in self.running}
        output = original(self, *args, **kwargs)
        try:
            rewrite = make_step_uniform(self, output, before)
        except GuardUnavailable as e:
            logger.error("gdn-guard %s (vllm#36917): left a mixed step unchanged: %s", NAME, e)
            return output
        if rewrite is not None:
            with state.lock:
                state.steps_rewritten += 1
                state.drafts_withdrawn += sum(rewrite.withdrawn.values())
                first = state.steps_rewritten == 1
            (logger.info if first else logger.debug)(
                "gdn-guard %s (vllm#36917): step mixed %d one-token non-spec row(s) with %d spec "
                "row(s); withdrew %d draft token(s) for this step (%d step(s) so far)",
                NAME,
                len(rewrite.lone_rows),
                len(rewrite.withdrawn),
                sum(rewrite.withdrawn.values()),
                state.steps_rewritten,
            )
        return output

    schedule.__name__ = getattr(original, "__name__", "schedule")
    schedule.__qualname__ = getattr(original, "__qualname__", "Scheduler.schedule")
    schedule.__doc__ = getattr(original, "__doc__", None)
    schedule.__wrapped__ = original
    setattr(schedule, MARK, True)
    return schedule


def apply() -> None:
    """Wrap ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` (idempotent)."""
    try:
        from vllm.v1.core.sched import scheduler as sched_mod
    except Exception as e:  # pragma: no cover - depends on the vLLM install
        raise GuardUnavailable(f"cannot import vllm.v1.core.sched.scheduler: {e}") from e
    cls = getattr(sched_mod, "Scheduler", None)
    if cls is None:
        raise GuardUnavailable("vllm.v1.core.sched.scheduler has no Scheduler class")
    current = cls.__dict__.get("schedule")
    if not callable(current):
        raise GuardUnavailable("Scheduler.schedule is not defined on the class")
    if getattr(current, MARK, False):
        return
    cls.schedule = _wrap_schedule(current)


def is_applied() -> bool:
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception:
        return False
    return bool(getattr(Scheduler.__dict__.get("schedule"), MARK, False))


def state_of(scheduler: Any) -> SchedulerGuardState | None:
    return scheduler.__dict__.get(STATE_ATTR)


GUARD = Guard(
    name=NAME,
    patch_id=PATCH_ID,
    upstream="vllm#36917 (vllm#34845, vllm#36122; fix PR #34871 in 0.18.0; approach of closed PR #36918)",
    versions=VersionRange(since=None, fixed_in="0.18.0"),
    summary="withdraw a step's drafts when it mixes spec-decode rows with one-token non-spec rows (GDN + spec decode)",
    apply=apply,
)
