"""The operator's side of the webhook front (front.py): its process, started by the operator's webhook
server (webhook/limits.BoundedWebhookServer) once kopf's own server listens on the loopback, kept running, and ended
with it.

The front's stdout carries a ready line, then the admission counters it counted (added to this process's
gdn_admission_decisions_total, which /metrics serves); its stderr is the operator's (one log). It runs in a session
of its own, so a signal to the operator's process group (Ctrl-C, a test harness) reaches the operator alone, which
then ends the front; its stdin stays open while this process lives, so when this process ends however it ends (a
SIGKILL included), the front ends too. A front that exits on its own is started again after a backoff
(RESTART_SECONDS, doubling up to RESTART_MAX_SECONDS while it keeps failing); the webhook is down in between, as it
is while the operator restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time

from gdn_operator import telemetry

log = logging.getLogger(__name__)

MODULE = "gdn_operator.front"
#: how long the front may take to import and open its port
READY_SECONDS = 60.0
#: the first wait before a front that exited is started again; doubled while it keeps failing, up to the most
RESTART_SECONDS = 1.0
RESTART_MAX_SECONDS = 60.0
#: a front that stayed up this long failed for a new reason: the backoff starts again from RESTART_SECONDS
STABLE_SECONDS = 60.0
#: the longest line read from the front's stdout (its reports are chunked well below it)
READ_LIMIT = 1 << 20


class FrontError(RuntimeError):
    """The front could not be started."""


class FrontProcess:
    """The front's process for one webhook server: `addr`:`port` public, the operator's server on `backend`."""

    def __init__(self, *, addr: str, port: int, backend: int, cert: str, key: str, ca: str, path: str = "") -> None:
        self.addr, self.port, self.backend = addr, port, backend
        self.args = [
            "--listen", f"{addr}:{port}", "--backend", str(backend), "--cert", cert, "--key", key, "--ca", ca, "--path", path,
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.supervisor: asyncio.Task[None] | None = None
        self.starts = 0
        self.stopping = False

    async def ensure_started(self) -> None:
        """Start the front and wait until it listens (once: later calls return at once). FrontError if it cannot."""
        if self.supervisor is not None or self.stopping:
            return
        await self._spawn()
        self.supervisor = asyncio.create_task(self._supervise(), name="webhook-front")

    async def _spawn(self) -> None:
        self.proc = proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            MODULE,
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=READ_LIMIT,
        )
        self.starts += 1
        assert proc.stdout is not None
        try:
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), READY_SECONDS)
                if not line:
                    raise FrontError(f"the webhook front exited with {await proc.wait()} before it listened on :{self.port}")
                if self._read(line) == "ready":
                    break
        except BaseException:  # not ready (a timeout, a cancellation): it must not live on unwatched
            await _end(proc)
            raise
        log.info(
            "webhook front (pid %d) listens on %s:%d; kopf's server on 127.0.0.1:%d", proc.pid, self.addr, self.port, self.backend
        )

    def _read(self, line: bytes) -> str:
        """One line of the front's stdout: "ready", counters added here ("counts"), or "" (not ours: logged)."""
        try:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                raise ValueError("not an object")
            if msg.get("ready"):
                return "ready"
            for namespace, decision, rule, delta in msg.get("decisions", ()):
                telemetry.admission_decision(str(namespace), str(decision), str(rule)).inc(float(delta))
        except (ValueError, TypeError) as e:
            log.warning("webhook front wrote %r (%s)", line[:200], e)
            return ""
        return "counts"

    async def _supervise(self) -> None:
        backoff = RESTART_SECONDS
        while not self.stopping:
            proc = self.proc
            assert proc is not None and proc.stdout is not None
            started = time.monotonic()
            try:
                while line := await proc.stdout.readline():
                    self._read(line)
            except ValueError as e:  # a line past READ_LIMIT: the front misbehaves; end it, start a new one
                log.error("webhook front: %s; ending it", e)
                await _end(proc)
            code = await proc.wait()
            if self.stopping:
                return
            if time.monotonic() - started >= STABLE_SECONDS:
                backoff = RESTART_SECONDS
            log.error("the webhook front exited with %s; starting it again in %.0f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_MAX_SECONDS)
            if self.stopping:
                return
            try:
                await self._spawn()
            except (FrontError, OSError) as e:
                log.error("%s", e)  # the next round waits longer and tries again

    async def stop(self) -> None:
        """End the front (idempotent): the supervisor first, so that it starts no other."""
        self.stopping = True
        if self.supervisor is not None and not self.supervisor.done():
            self.supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.supervisor
        if self.proc is not None:
            await _end(self.proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 10 s; waits for it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
