"""Admission requests with bounded size and nesting, answered with a 4xx review instead of an HTTP 500.

kopf's webhook server reads the body with aiohttp's 1 MiB limit (an UPDATE review carries the old and
the new object, so a 600 KiB object already exceeds it) and decodes it recursively (JSON nested ~1000
deep raises RecursionError). Either failure was an HTTP error to the API server, which with
failurePolicy Fail turns every such request into an opaque 500 for the user. Here the body is read up to
MAX_BODY_BYTES (well above what the API server sends: 3 MiB per object), and the new object's nesting is
checked before kopf or pydantic touch it; a violation is an AdmissionReview denial with code 413 / 422
and the field path.
"""

from __future__ import annotations

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
from gdn_operator.handlers.frontprocess import FrontProcess
from gdn_operator.handlers.kopfcompat import AmbiguousResourceError, UnknownResourceError, WebhookError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_DEPTH = MAX_OBJECT_DEPTH  # deepest nesting of the admitted object (api/k8s.py)
_UID = re.compile(r'"uid"\s*:\s*"([^"]{1,128})"')
_OBJECT = "request.object"


def _in_object(path: str) -> str:
    """A path of the review (`request.object.spec.x`) as a path of the object (`spec.x`), as gdnctl names it."""
    return path.removeprefix(_OBJECT).lstrip(".")


def review_answer(review: dict[str, Any], uid: str, warnings: list[str], status: dict[str, Any] | None) -> dict[str, Any]:
    """The AdmissionReview answer, in the shape kopf's server gives (kopf/_core/engines/admission.py build_response):
    allowed unless there is a status; the warnings as strings."""
    response: dict[str, Any] = {"uid": uid, "allowed": status is None}
    if warnings:
        response["warnings"] = [str(w) for w in warnings]
    if status is not None:
        response["status"] = status
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": review.get("kind", "AdmissionReview"),
        "response": response,
    }


def denial(review: dict[str, Any] | None, uid: str, code: int, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response(review_answer(review or {}, uid, [], {"code": code, "message": message}))


async def read_bounded_bytes(request: aiohttp.web.Request) -> bytes:
    """The body (HTTP 413 beyond MAX_BODY_BYTES, which the API server never sends)."""
    body = bytearray()
    while True:
        chunk = await request.content.read(1 << 16)  # StreamReader.read(n) may return less than n; b"" at EOF
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=len(body))


async def read_bounded(request: aiohttp.web.Request) -> str:
    """The body as text (HTTP 413 beyond MAX_BODY_BYTES)."""
    return (await read_bounded_bytes(request)).decode("utf-8", errors="replace")


def precheck(text: str) -> tuple[dict[str, Any] | None, aiohttp.web.Response | None]:
    """(review, None) to go on with kopf, or (None, a denial) for an object nested too deep."""
    try:
        review = json.loads(text)
    except json.JSONDecodeError as e:
        raise aiohttp.web.HTTPBadRequest(reason=str(e)) from None
    except RecursionError:
        uid_match = _UID.search(text)
        # the object lies two levels down (request, object): the same depth, counted from the object
        msg = nested_too_deep(_in_object(too_deep_in_text(text, MAX_DEPTH + 2) or _OBJECT))
        log.info("admission denied before decoding: %s", msg)
        return None, denial(None, uid_match.group(1) if uid_match else "", 422, msg)
    request = review.get("request") if isinstance(review, dict) else None
    if isinstance(request, dict):
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


#: an admission path answered outside kopf (handlers/guardadmission.py): review -> AdmissionReview answer
Route = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, with the size and nesting bounds above. `routes` answers the paths kopf
    does not serve (the guard webhook); `on_publish` hears each clientConfig the server advertises.

    With `front=True` (GDN_WEBHOOK_PROCESS=own) the configured address and port belong to the webhook front, a process
    of its own (handlers/webhookfront.py, started here once kopf's server listens), and kopf's server listens on a
    loopback port for what the front passes on; the advertised URL keeps the configured port."""

    def __init__(self, *, front: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.routes: dict[str, Route] = {}
        self.on_publish: list[Callable[[dict[str, Any]], None]] = []
        self.front: FrontProcess | None = None
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
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        text = await read_bounded(request)
        review, deny = precheck(text)
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
