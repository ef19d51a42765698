"""Helpers the engine-venv scripts use to report what gdn-guard did (they work without gdn-guard)."""

from __future__ import annotations


def schedule_wrapped() -> bool:
    from vllm.v1.core.sched.scheduler import Scheduler

    return bool(getattr(Scheduler.__dict__.get("schedule"), "__gdn_guard_vllm_36917__", False))


def scheduler_state(scheduler) -> dict | None:
    st = scheduler.__dict__.get("_gdn_guard_vllm_36917")
    if st is None:
        return None
    return {
        "armed": st.armed,
        "reason": st.reason,
        "steps_rewritten": st.steps_rewritten,
        "drafts_withdrawn": st.drafts_withdrawn,
    }
