"""Crash watch, log following: one bounded streaming read of each running engine container's log, on its own
thread pool, started from pod events.

What a stream gives: the crash diagnosis as soon as the log shows it (kept in `StreamedResults` until the
container's death is handled, handlers/engines/crashwatch.py) and the gdn-guard plugin's start-up line (handed to
the patch-set check, handlers/engines/patchset.py). A stream survives API-server outages (reconnect with
backoff, reading only what it missed) and ends with its container instance.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from gdn_operator.api.load import parse_spec
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.kube import ApiException
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines.patchset import report_patch_check
from gdn_operator.labels import LABEL_SERVER
from gdn_operator.render.engine import CONTAINER
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.guardline import SEARCH_BYTES as GUARD_SEARCH_BYTES
from gdn_operator.watch.guardline import GuardLine, parse_guard_line
from gdn_operator.watch.logstream import StreamClassifier
from gdn_operator.watch.result import ClassificationResult

log = logging.getLogger(__name__)


class StreamedResults:
    """Streamed-log classifications per (pod uid, restart count), consumed when the death is handled (bounded)."""

    def __init__(self, size: int = 4096) -> None:
        self._d: collections.OrderedDict[tuple[str, int], ClassificationResult] = collections.OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def remember(self, pod_uid: str, restart_count: int, result: ClassificationResult) -> None:
        with self._lock:
            if len(self._d) >= self._size and (pod_uid, restart_count) not in self._d:
                self._d.popitem(last=False)
            self._d[(pod_uid, restart_count)] = result

    def take(self, pod_uid: str, restart_count: int) -> ClassificationResult | None:
        with self._lock:
            return self._d.pop((pod_uid, restart_count), None)


def evidence_for(servers: Servers, namespace: str, name: str) -> Evidence | None:
    """What the operator knows about a server from the spec it rendered (model family, speculative decoding,
    GDN prefill backend, vLLM version): the classifier names an upstream issue only with that evidence
    (or the log's). None when the server cannot be read or its spec is invalid."""
    try:
        obj = servers.current(namespace, name)  # the newest body seen: no read when the operator holds one
        return Evidence.from_spec(parse_spec((obj or {}).get("spec") or {})) if obj else None
    except Exception as e:  # noqa: BLE001 - evidence is optional: classify without it
        log.debug("no spec evidence for %s/%s: %s", namespace, name, e)
        return None


@dataclass
class StreamState:
    """What survives a reconnect of one container instance's log stream."""

    classifier: StreamClassifier
    #: keeps a crash diagnosis for the death of this instance (the one that ran with restartCount N dies
    #: as death number N+1, crashwatch.deaths_in)
    remember: Callable[[ClassificationResult], None]
    last_read: float | None = None  # time.time() of the last chunk
    guard_done: bool = False
    searched: int = 0
    carry: str = ""


class OpenStreams:
    """The followed log streams being read now, so that the operator's shutdown can end them.

    A thread reading a followed log blocks until the engine writes a line or the read times out (600 s). The
    interpreter joins executor threads at exit, so without this an operator told to stop (SIGTERM) would live on
    until every quiet engine wrote a line: past the pod's termination grace period, where it is killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self.closed = False

    def add(self, resp: Any) -> None:
        with self._lock:
            if not self.closed:
                self._open.add(resp)
                return
        resp.shutdown()  # opened after shutdown_all: end it at once

    def discard(self, resp: Any) -> None:
        with self._lock:
            self._open.discard(resp)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def shutdown_all(self) -> int:
        """End every open stream (the blocked reads return) and any opened later. Returns how many were open."""
        with self._lock:
            self.closed = True
            live, self._open = list(self._open), set()
        for resp in live:
            try:
                resp.shutdown()  # urllib3 HTTPResponse.shutdown: shuts the socket down, waking a blocked read
            except Exception as e:  # noqa: BLE001 - best effort at shutdown: a stream already gone is fine
                log.debug("log stream not shut down: %s", e)
        return len(live)


def _stream_once(
    namespace: str,
    pod: str,
    stop: Callable[[], bool],
    on_guard: Callable[[GuardLine | None], None],
    state: StreamState,
    container: str = CONTAINER,
    streams: OpenStreams | None = None,
) -> str:
    """Follow one container instance's log until the stream ends (or `streams` is shut down). Returns why it ended."""
    since = None
    if state.last_read is not None:  # reconnect: do not read the whole log again
        since = max(1, math.ceil(time.time() - state.last_read) + 1)
    resp = kube.pod_log_stream(namespace, pod, container, since)
    if streams is not None:
        streams.add(resp)
    sc = state.classifier
    try:
        for chunk in resp.stream(64 * 1024):
            state.last_read = time.time()
            sc.feed(chunk)
            if sc.crashed:
                # keep the diagnosis as soon as it is there: the process may be killed before EOF
                state.remember(sc.result())
            if not state.guard_done:
                text = state.carry + chunk.decode("utf-8", errors="replace")
                found = parse_guard_line(text)
                state.searched += len(chunk)
                if found is not None or state.searched >= GUARD_SEARCH_BYTES:
                    on_guard(found)
                    state.guard_done = True
                state.carry = text[-1024:]
            if stop():
                return "stopped"
        return "eof"
    finally:
        if streams is not None:
            streams.discard(resp)
        resp.release_conn()


def _instance_running(namespace: str, pod: str, uid: str, restart: int, container: str = CONTAINER) -> bool | None:
    """Whether this container instance still runs; None when the API server cannot say (outage)."""
    try:
        body = kube.read_pod(namespace, pod)
    except ApiException as e:
        if e.status == 404:
            return False
        return None if e.status >= 500 or e.status == 429 else False
    except Exception as e:  # noqa: BLE001 - connection refused/reset, timeouts: the API server is away, not the pod
        log.warning("cannot tell whether %s/%s still runs (API server unreachable): %s", namespace, pod, e)
        return None
    if body["metadata"].get("uid") != uid or body["metadata"].get("deletionTimestamp"):
        return False
    cs: dict[str, Any] = next(
        (c for c in (body.get("status") or {}).get("containerStatuses") or [] if c.get("name") == container), {}
    )
    return int(cs.get("restartCount") or 0) == restart and bool((cs.get("state") or {}).get("running"))


class LogFollowers:
    """One bounded log-follow task per running engine container instance, started from pod events.

    (Not a kopf daemon: daemons make kopf put a finalizer on every engine pod, which would block pod
    deletion whenever the operator is down.)"""

    def __init__(self, pool: Executor, streamed: StreamedResults, servers: Servers) -> None:
        self.pool = pool  # log streams hold a thread while the engine runs: never the pool status writes use
        self.streamed = streamed
        self.servers = servers  # the one door to the servers (handlers/core/servers.py)
        self.tasks: dict[str, tuple[int, asyncio.Task[None]]] = {}
        #: the log classifier of each followed pod's current container instance, by (namespace, pod)
        self.classifiers: dict[tuple[str, str], StreamClassifier] = {}
        self.streams = OpenStreams()  # ended by stop_all (the operator's shutdown)

    def hang_summary(self, namespace: str, pod: str) -> str:
        """Hang wording seen in the pod's current log (watch/hang.py): a stall's supporting evidence."""
        sc = self.classifiers.get((namespace, pod))
        return sc.hang.summary() if sc is not None else ""

    def ensure(self, namespace: str, pod: dict[str, Any], container: str = CONTAINER) -> None:
        """Follow the running engine container `container` of `pod` (the operator's own, or the one a GDNGuard
        found in a guarded pod: then no server label, no spec evidence and no gdn-guard patch-set check)."""
        uid = pod["metadata"].get("uid", "")
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c.get("name") == container), None)
        running = bool(cs and (cs.get("state") or {}).get("running"))
        restart = int((cs or {}).get("restartCount") or 0)
        current = self.tasks.get(uid)
        if current and (not current[1].done()) and current[0] == restart and running:
            return
        if current and not current[1].done() and current[0] != restart:
            current[1].cancel()
        if not running or pod["metadata"].get("deletionTimestamp"):
            return
        name = pod["metadata"]["name"]
        server = (pod["metadata"].get("labels") or {}).get(LABEL_SERVER, "")
        task = asyncio.get_running_loop().create_task(self._follow(namespace, name, uid, restart, server, container))
        self.tasks[uid] = (restart, task)

    def stop(self, uid: str) -> None:
        cur = self.tasks.pop(uid, None)
        if cur:
            cur[1].cancel()

    def stop_all(self) -> None:
        """At shutdown: cancel every follow task and end the streams their threads read."""
        for uid in list(self.tasks):
            self.stop(uid)
        ended = self.streams.shutdown_all()
        if ended:
            log.info("shutdown: ended %d followed log stream(s)", ended)

    async def _follow(self, namespace: str, pod: str, uid: str, restart: int, server: str, container: str = CONTAINER) -> None:
        stop = threading.Event()
        backoff = 1.0
        checked: list[bool] = []

        def on_guard(line: GuardLine | None) -> None:
            if not checked and server:  # once per container instance, also across reconnects; servers only
                checked.append(True)
                report_patch_check(self.servers, namespace, server, pod, line)

        loop = asyncio.get_running_loop()
        evidence = await loop.run_in_executor(self.pool, evidence_for, self.servers, namespace, server) if server else None
        state = StreamState(StreamClassifier(evidence=evidence), lambda result: self.streamed.remember(uid, restart + 1, result))
        self.classifiers[(namespace, pod)] = state.classifier
        try:
            while True:  # until this container instance ends; a restart starts a new task
                try:
                    why = await loop.run_in_executor(
                        self.pool, _stream_once, namespace, pod, stop.is_set, on_guard, state, container, self.streams
                    )
                    if why == "stopped":
                        return
                    backoff = 1.0  # a clean end: the API server closed the stream (or the container ended)
                except Exception as e:  # noqa: BLE001 - disconnects, 4xx from fake nodes: retry with backoff
                    log.warning(
                        "log stream of %s/%s (server %s) interrupted, retrying in %.0fs: %s", namespace, pod, server, backoff, e
                    )
                running = await loop.run_in_executor(self.pool, _instance_running, namespace, pod, uid, restart, container)
                if running is False:
                    state.classifier.close()
                    if state.classifier.crashed:
                        state.remember(state.classifier.result())
                    if not state.guard_done and state.searched:
                        try:
                            on_guard(None)
                        except Exception as e:  # noqa: BLE001 - best effort: the patch check is a report
                            log.warning("patch-set check of %s/%s not recorded: %s", namespace, pod, e)
                    return
                # running, or unknown during an API-server outage: follow again after the backoff
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 120.0)
        finally:
            stop.set()
            if self.classifiers.get((namespace, pod)) is state.classifier:
                del self.classifiers[(namespace, pod)]
