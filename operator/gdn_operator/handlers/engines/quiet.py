"""Crash watch, the quiet period: the crash conditions (CrashLooping, and with it Degraded EngineCrashed) clear once the engines have run
`GDN_CRASH_QUIET_SECONDS` without a crash and are Ready (a crash loop has ready phases between crashes, so a
single ready pod must not clear them).

Its own timer: one task checks the servers whose status shows crash conditions every CHECK_SECONDS (fed by
GDNModelServer events through handlers/main.py), and re-applies an autoscaler whose scale-up paused while
the server was CrashLooping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core.autoscaler import sync_scale_up
from gdn_operator.handlers.core.plan import PlanInputs
from gdn_operator.handlers.core.servers import Servers

log = logging.getLogger(__name__)

#: How often flagged servers are checked for a quiet period.
CHECK_SECONDS = 60.0


def age_seconds(ts: str | None) -> float:
    if not ts:
        return float("inf")
    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (dt.datetime.now(dt.UTC) - t).total_seconds()


def clear_crash_conditions(servers: Servers, namespace: str, name: str, quiet_seconds: float) -> dict[str, Any] | None:
    """Clear the crash conditions when the last crash is `quiet_seconds` old and the server is Ready.
    Returns the object after the check (None: it is gone)."""
    cleared: list[bool] = []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        cleared.clear()
        gen = obj["metadata"].get("generation")
        if age_seconds((status.get("lastCrash") or {}).get("time")) < quiet_seconds:
            return
        if not st.is_true(status, st.READY):
            return
        if st.crash_recent(status):  # Degraded (EngineCrashed) follows (conditions.refresh_degraded)
            st.set_condition(status, st.CRASH_LOOPING, False, "EnginesRunning", "engines are running", gen)
            cleared.append(True)

    obj = servers.update_status(namespace, name, mutate)
    if obj is None or not cleared:
        return obj
    log.info(
        "crash conditions cleared on %s/%s generation %s: no crash for %.0fs and Ready",
        namespace,
        name,
        obj["metadata"].get("generation"),
        quiet_seconds,
    )
    return obj


class QuietPeriod:
    """The servers whose status shows crash conditions, and the timer that clears them."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs  # the settings (quiet seconds) and what re-planning the autoscaler reads
        self.flagged: set[tuple[str, str]] = set()
        self.task: asyncio.Task[None] | None = None

    def track(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        status = body.get("status") or {}
        if st.crash_recent(status):
            self.flagged.add((namespace, name))
        else:
            self.flagged.discard((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        self.flagged.discard((namespace, name))

    def check(self, namespace: str, name: str) -> None:
        """One server (blocking: runs in a worker thread)."""
        obj = clear_crash_conditions(self.inputs.servers, namespace, name, self.inputs.settings.crash_quiet_seconds)
        if obj is not None:
            sync_scale_up(namespace, name, obj, self.inputs)

    async def run(self) -> None:
        while True:
            keys = sorted(self.flagged)
            results = await asyncio.gather(
                *(asyncio.to_thread(self.check, ns, name) for ns, name in keys), return_exceptions=True
            )
            for (ns, name), r in zip(keys, results, strict=True):
                if isinstance(r, Exception):
                    log.warning("quiet-period check of %s/%s failed (retried in %.0fs): %s", ns, name, CHECK_SECONDS, r)
            await asyncio.sleep(CHECK_SECONDS)
