"""The operator's side of the webhook front (handlers/webhookfront.py): its process, started by the operator's webhook
server (webhook_limits.BoundedWebhookServer) once kopf's own server listens on the loopback, kept running, and ended
with it.

The front's stdout carries a ready line, then the admission counters it counted (added to this process's
gdn_admission_decisions_total, which /metrics serves); its stderr is the operator's (one log). Its stdin stays open
while this process lives: when this process ends, however it ends, the front ends too. A front that exits on its own
is started again after RESTART_SECONDS (the webhook is down in between, as it is while the operator restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys

from gdn_operator import telemetry

log = logging.getLogger(__name__)

MODULE = "gdn_operator.handlers.webhookfront"
#: how long the front may take to import and open its port
READY_SECONDS = 60.0
#: the wait before a front that exited is started again
RESTART_SECONDS = 1.0


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
        if self.supervisor is not None:
            return
        await self._spawn()
        self.supervisor = asyncio.create_task(self._supervise(), name="webhook-front")

    async def _spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", MODULE, *self.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        self.starts += 1
        assert self.proc.stdout is not None
        try:
            while True:
                line = await asyncio.wait_for(self.proc.stdout.readline(), READY_SECONDS)
                if not line:
                    raise FrontError(f"the webhook front exited with {await self.proc.wait()} before it listened on :{self.port}")
                if self._read(line) == "ready":
                    break
        except TimeoutError:
            self.proc.kill()
            raise FrontError(f"the webhook front did not listen on :{self.port} within {READY_SECONDS:.0f} s") from None
        log.info(
            "webhook front (pid %d) listens on %s:%d; kopf's server on 127.0.0.1:%d",
            self.proc.pid,
            self.addr,
            self.port,
            self.backend,
        )

    def _read(self, line: bytes) -> str:
        """One line of the front's stdout: "ready", counters added here ("counts"), or "" (not ours: logged)."""
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            log.warning("webhook front wrote %r", line[:200])
            return ""
        if msg.get("ready"):
            return "ready"
        for namespace, decision, rule, delta in msg.get("decisions", ()):
            telemetry.ADMISSION_DECISIONS.labels(namespace, decision, rule).inc(delta)
        return "counts"

    async def _supervise(self) -> None:
        while not self.stopping:
            proc = self.proc
            assert proc is not None and proc.stdout is not None
            while line := await proc.stdout.readline():
                self._read(line)
            code = await proc.wait()
            if self.stopping:
                return
            log.error("the webhook front exited with %s; starting it again in %.0f s", code, RESTART_SECONDS)
            await asyncio.sleep(RESTART_SECONDS)
            try:
                await self._spawn()
            except (FrontError, OSError) as e:
                log.error("%s", e)  # the next round waits and tries again

    async def stop(self) -> None:
        """End the front (idempotent)."""
        self.stopping = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self.supervisor is not None and not self.supervisor.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.supervisor, 5)
