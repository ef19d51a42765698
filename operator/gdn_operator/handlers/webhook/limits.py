"""Admission requests with bounded size, time, concurrency and nesting, answered with a 4xx instead of an HTTP 500.

Who may call: the webhook port answers whoever reaches it (the chart's NetworkPolicy narrows that to the API server,
where the cluster enforces NetworkPolicies), so everything here bounds what an unauthenticated caller can cost, the
way the API server bounds its own clients (issue 48):

* size: the API server refuses request bodies over 3 MiB (API_SERVER_REQUEST_BYTES), so an object it sends is at
  most that, and an UPDATE review carries two (the object and the old object) in an envelope: MAX_BODY_BYTES. A
  declared Content-Length beyond it is refused before a byte is read, a body that grows past it as soon as it does
  (HTTP 413); kopf's own 1 MiB aiohttp limit is not used (a 600 KiB object's UPDATE exceeds it).
* time: the whole body must arrive within READ_SECONDS (the API server gives up on its webhook call after
  WEBHOOK_TIMEOUT_SECONDS anyway): a slow body is answered 408 and its connection closed.
* concurrency: the bodies a process holds (being read, or waiting for their turn) are at most HELD_BUDGET_BYTES
  (more: 503); at most MAX_REVIEWS reviews are decoded and judged at once, and of those MAX_LARGE_REVIEWS larger
  than LARGE_BYTES (ReviewGate); one more waits for a turn until the read deadline, then gets 503. Reading takes
  no turn, so slow bodies hold no turn of the reviews that arrived. Memory is bounded by the budget plus the
  decoded reviews in their turns, whatever the flood (bench/bench_webhook_flood.py measures it).
* shape: a body that is not JSON, holds a number Python will not convert (a 5000-digit integer), is not an
  AdmissionReview object with a `request` object, or whose object is nested past MAX_DEPTH (RecursionError while
  decoding, or checked before kopf or pydantic touch it) is answered 400, or an AdmissionReview denial with
  code 422 and the field path when the review's uid can be read (nesting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp.web
import kopf

from gdn_operator.api.k8s import MAX_OBJECT_DEPTH, nested_too_deep, too_deep, too_deep_in_text
from gdn_operator.handlers.core.kopfcompat import AmbiguousResourceError, UnknownResourceError, WebhookError
from gdn_operator.handlers.webhook.frontprocess import FrontProcess

log = logging.getLogger(__name__)

#: kube-apiserver's limit on a request body (its MaxRequestBodyBytes): no object it sends is larger
API_SERVER_REQUEST_BYTES = 3 * 1024 * 1024
#: the largest review: an UPDATE's object and old object, each at most API_SERVER_REQUEST_BYTES, plus the envelope
MAX_BODY_BYTES = 2 * API_SERVER_REQUEST_BYTES + 256 * 1024
#: how long the whole body may take to arrive: the API server waits at most webhook/configs.WEBHOOK_TIMEOUT_SECONDS
#: (10 s) for the answer, so a body slower than that comes from no API server
READ_SECONDS = 10.0
#: reviews read, decoded and answered at once, per process (more wait for a turn until the read deadline)
MAX_REVIEWS = 8
#: of those, how many may be larger than LARGE_BYTES: decoded JSON takes many times its size in Python objects, so
#: a review near MAX_BODY_BYTES takes ~100 MiB while it is judged (bench/bench_webhook_flood.py); one at a time keeps a
#: flood inside the container's memory (GDNModelServers and the workloads guards judge are a few KiB)
MAX_LARGE_REVIEWS = 1
LARGE_BYTES = 256 * 1024
#: the bodies one process holds at once, read or being read (a flood of bodies gets 503 past it)
HELD_BUDGET_BYTES = 64 * 1024 * 1024
MAX_DEPTH = MAX_OBJECT_DEPTH  # deepest nesting of the admitted object (api/k8s.py)
_UID = re.compile(r'"uid"\s*:\s*"([^"]{1,128})"')
_OBJECT = "request.object"


def _in_object(path: str) -> str:
    """A path of the review (`request.object.spec.x`) as a path of the object (`spec.x`), as gdnctl names it."""
    return path.removeprefix(_OBJECT).lstrip(".")


def review_answer(review: dict[str, Any], uid: str, warnings: list[str], status: dict[str, Any] | None) -> dict[str, Any]:
    """The AdmissionReview answer, in the shape kopf's server gives (kopf/_core/engines/admission.py build_response):
    allowed unless there is a status; the warnings as strings. The one answer shape of every path kopf does not
    answer: the bounds' denials here, the webhook front (front.py), the guard webhook (handlers/guard/admission.py)."""
    response: dict[str, Any] = {"uid": uid, "allowed": status is None}
    if warnings:
        response["warnings"] = [str(w) for w in warnings]
    if status is not None:
        response["status"] = status
    return {
        "apiVersion": review.get("apiVersion") or "admission.k8s.io/v1",
        "kind": review.get("kind") or "AdmissionReview",
        "response": response,
    }


def denial(review: dict[str, Any] | None, uid: str, code: int, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response(review_answer(review or {}, uid, [], {"code": code, "message": message}))


class ReviewGate:
    """The bounds of one process's reviews (the front's, or the operator's webhook server's): each body read within
    `read_seconds` and at most MAX_BODY_BYTES; the bodies held at once (being read, waiting, judged) at most
    `held_budget` bytes; at most `limit` reviews decoded and judged at once, of those at most `large_limit` larger
    than LARGE_BYTES. Reading takes no turn: a slow body costs the bytes it sent and its connection, never a turn of
    the reviews that arrived."""

    def __init__(
        self,
        limit: int = MAX_REVIEWS,
        read_seconds: float = READ_SECONDS,
        large_limit: int = MAX_LARGE_REVIEWS,
        held_budget: int = HELD_BUDGET_BYTES,
    ) -> None:
        self.limit, self.read_seconds, self.held_budget = limit, read_seconds, held_budget
        self.held = 0
        self._slots = asyncio.Semaphore(limit)
        self._large = asyncio.Semaphore(large_limit)

    @contextlib.asynccontextmanager
    async def turn(self, request: aiohttp.web.Request) -> AsyncIterator[bytes]:
        """The request's body, read within the deadline, then one of the gate's turns (and the large one for a body
        past LARGE_BYTES) while the caller judges it. HTTP 413 past MAX_BODY_BYTES, 408 past the deadline, 503 when
        the bodies held reach the budget or no turn comes before the deadline."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY_BYTES:  # refused before a byte is read
            raise _closing(aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=declared))
        deadline = asyncio.get_running_loop().time() + self.read_seconds
        body = bytearray()
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    while chunk := await request.content.read(1 << 16):  # may return less than asked; b"" at EOF
                        if len(body) + len(chunk) > MAX_BODY_BYTES:
                            too_large = aiohttp.web.HTTPRequestEntityTooLarge(
                                max_size=MAX_BODY_BYTES, actual_size=len(body) + len(chunk)
                            )
                            raise _closing(too_large)
                        if self.held + len(chunk) > self.held_budget:
                            raise _closing(aiohttp.web.HTTPServiceUnavailable(reason="too many admission review bytes in flight"))
                        self.held += len(chunk)
                        body += chunk
            except TimeoutError:
                late = aiohttp.web.HTTPRequestTimeout(reason=f"the review did not arrive within {self.read_seconds:.0f}s")
                raise _closing(late) from None
            async with contextlib.AsyncExitStack() as turns:
                await self._take(self._slots, deadline, turns)
                if len(body) > LARGE_BYTES:
                    await self._take(self._large, deadline, turns)
                yield bytes(body)
        finally:
            self.held -= len(body)

    @staticmethod
    async def _take(slots: asyncio.Semaphore, deadline: float, held: contextlib.AsyncExitStack) -> None:
        """One of `slots` before the deadline (HTTP 503 after it), released when `held` closes."""
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            raise aiohttp.web.HTTPServiceUnavailable(reason="too many admission reviews in flight") from None
        held.callback(slots.release)


def _closing(answer: aiohttp.web.HTTPException) -> aiohttp.web.HTTPException:
    """`answer`, ending its connection: the rest of a body refused unread is never read (aiohttp would otherwise
    read and discard it, up to its lingering time, decrypting every byte)."""
    answer.force_close()
    return answer


def _bad(why: str) -> aiohttp.web.HTTPBadRequest:
    return aiohttp.web.HTTPBadRequest(reason=f"not an AdmissionReview: {why}"[:200])


def precheck(text: str) -> tuple[dict[str, Any] | None, aiohttp.web.Response | None]:
    """(review, None) to go on with, or (None, a denial) for an object nested too deep; HTTP 400 for anything that
    is not an AdmissionReview the API server could have sent."""
    try:
        review = json.loads(text)
    except RecursionError:
        uid_match = _UID.search(text[:65536])
        # the object lies two levels down (request, object): the same depth, counted from the object
        msg = nested_too_deep(_in_object(too_deep_in_text(text, MAX_DEPTH + 2) or _OBJECT))
        log.info("admission denied before decoding: %s", msg)
        return None, denial(None, uid_match.group(1) if uid_match else "", 422, msg)
    except ValueError as e:  # JSONDecodeError, and a number past int's digit limit ("Exceeds the limit ... digits")
        raise _bad(str(e)) from None
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        raise _bad("no request object")
    if not isinstance(request.get("uid", ""), str) or any(
        not isinstance(request.get(k), (dict, type(None))) for k in ("object", "oldObject", "kind", "resource", "userInfo")
    ):
        raise _bad("request.uid, object, oldObject, kind, resource or userInfo of the wrong type")
    deep_at = too_deep(request.get("object"), MAX_DEPTH)
    if deep_at is not None:
        msg = nested_too_deep(deep_at)
        log.info("admission denied: %s", msg)
        return None, denial(review, str(request.get("uid", "")), 422, msg)
    return review, None


def free_loopback_port() -> int:
    """A TCP port free on the loopback now (kopf's server behind the front binds it once kopf starts it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_port(url: str, port: int) -> str:
    """`url` with its port replaced."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{port}"))


#: an admission path answered outside kopf (handlers/guard/admission.py): review -> AdmissionReview answer
Route = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, with the size and nesting bounds above. `routes` answers the paths kopf
    does not serve (the guard webhook); `on_publish` hears each clientConfig the server advertises.

    With `front=True` (GDN_WEBHOOK_PROCESS=own) the configured address and port belong to the webhook front, a process
    of its own (front.py, started here once kopf's server listens), and kopf's server listens on a
    loopback port for what the front passes on; the advertised URL keeps the configured port."""

    def __init__(self, *, front: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.routes: dict[str, Route] = {}
        self.on_publish: list[Callable[[dict[str, Any]], None]] = []
        self.front: FrontProcess | None = None
        self.gate = ReviewGate()
        if front:
            if not (self.certfile and self.pkeyfile and self.cafile and self.port):
                raise ValueError("the webhook front needs a port and certificate files (certfile, pkeyfile, cafile)")
            backend = free_loopback_port()
            self.front = FrontProcess(
                addr=self.addr or "",
                port=self.port,
                backend=backend,
                cert=str(self.certfile),
                key=str(self.pkeyfile),
                ca=str(self.cafile),
                path=self.path or "",
            )
            self.addr, self.port = "127.0.0.1", backend

    def advertised(self, client_config: Any) -> Any:
        """The clientConfig the API server is given for kopf's (a subclass may point it elsewhere): with a front,
        its URL names the front's port."""
        if self.front is not None and client_config.get("url"):
            client_config = dict(client_config)
            client_config["url"] = with_port(client_config["url"], self.front.port)
        return client_config

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        try:
            async for cfg in super().__call__(fn):
                if self.front is not None:  # kopf's server listens: the front may pass requests on
                    await self.front.ensure_started()
                out = self.advertised(cfg)
                for hear in self.on_publish:
                    hear(dict(out))
                yield out
        finally:
            if self.front is not None:
                await self.front.stop()

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        async with self.gate.turn(request) as raw:
            return await self._answer(fn, request, raw)

    async def _answer(self, fn: Any, request: aiohttp.web.Request, raw: bytes) -> aiohttp.web.Response:
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        review, deny = precheck(raw.decode("utf-8", errors="replace"))
        if deny is not None:
            return deny
        route = self.routes.get(request.match_info.get("id") or "")
        if route is not None and review is not None:
            return aiohttp.web.json_response(await route(review))
        try:
            response = await fn(review, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers)
        except AmbiguousResourceError as e:
            raise aiohttp.web.HTTPConflict(reason=str(e) or None) from e
        except UnknownResourceError as e:
            raise aiohttp.web.HTTPNotFound(reason=str(e) or None) from e
        except WebhookError as e:
            raise aiohttp.web.HTTPBadRequest(reason=str(e) or None) from e
        return aiohttp.web.json_response(response)
