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
from typing import Any

import aiohttp.web
import kopf

from gdn_operator.api.k8s import too_deep
from gdn_operator.handlers.kopfcompat import AmbiguousResourceError, UnknownResourceError, WebhookError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
#: deepest nesting of the admitted object (the GDNModelServer schema needs < 20; Kubernetes allows 10000)
MAX_DEPTH = 64
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]')
_UID = re.compile(r'"uid"\s*:\s*"([^"]{1,128})"')


def _path(frames: list[list[Any]]) -> str:
    out = ""
    for kind, key in frames:
        if key is None:
            continue
        out += f"[{key}]" if kind == "[" else (f".{key}" if out else str(key))
    return out


def too_deep_in_text(text: str, limit: int = MAX_DEPTH) -> str | None:
    """Scan raw JSON without recursion: the path where nesting first exceeds `limit`, or None."""
    frames: list[list[Any]] = []  # [kind, key-or-index]
    pending_key: str | None = None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            pending_key = tok[1:-1]
        elif tok == ":":
            if frames and frames[-1][0] == "{":
                frames[-1][1] = pending_key
        elif tok == ",":
            if frames and frames[-1][0] == "[":
                frames[-1][1] += 1
        elif tok in "{[":
            frames.append([tok, 0 if tok == "[" else None])
            if len(frames) > limit:
                return _path(frames[:limit])
        else:
            if frames:
                frames.pop()
    return None


def _field(path: str) -> str:
    """`request.object.spec.affinity.a.b…` → `spec.affinity` (the field a user can fix)."""
    parts = re.split(r"(?=[.\[])", path.removeprefix("request.object").lstrip("."))
    return "".join(parts[:2]).lstrip(".") or "(object)"


def denial(review: dict[str, Any] | None, uid: str, code: int, message: str) -> aiohttp.web.Response:
    api_version = (review or {}).get("apiVersion") or "admission.k8s.io/v1"
    return aiohttp.web.json_response(
        {
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": False, "status": {"code": code, "message": message}},
        }
    )


async def read_bounded(request: aiohttp.web.Request) -> str:
    """The body as text (HTTP 413 beyond MAX_BODY_BYTES, which the API server never sends)."""
    body = bytearray()
    while True:
        chunk = await request.content.read(1 << 16)  # StreamReader.read(n) may return less than n; b"" at EOF
        if not chunk:
            return body.decode("utf-8", errors="replace")
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=len(body))


def precheck(text: str) -> tuple[dict[str, Any] | None, aiohttp.web.Response | None]:
    """(review, None) to go on with kopf, or (None, a denial) for an object nested too deep."""
    try:
        review = json.loads(text)
    except json.JSONDecodeError as e:
        raise aiohttp.web.HTTPBadRequest(reason=str(e)) from None
    except RecursionError:
        uid_match = _UID.search(text)
        where = too_deep_in_text(text) or "request.object"
        msg = f"{_field(where)}: nested deeper than {MAX_DEPTH} levels (at {where[:200]}); no GDNModelServer field needs that"
        log.info("admission denied before decoding: %s", msg)
        return None, denial(None, uid_match.group(1) if uid_match else "", 422, msg)
    request = review.get("request") if isinstance(review, dict) else None
    if isinstance(request, dict):
        deep_at = too_deep(request.get("object"), MAX_DEPTH)
        if deep_at is not None:
            msg = (
                f"{_field(deep_at)}: nested deeper than {MAX_DEPTH} levels (at {deep_at[:200]}); "
                "no GDNModelServer field needs that"
            )
            log.info("admission denied: %s", msg)
            return None, denial(review, str(request.get("uid", "")), 422, msg)
    return review, None


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, with the size and nesting bounds above."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        text = await read_bounded(request)
        review, deny = precheck(text)
        if deny is not None:
            return deny
        try:
            response = await fn(review, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers)
        except AmbiguousResourceError as e:
            raise aiohttp.web.HTTPConflict(reason=str(e) or None) from e
        except UnknownResourceError as e:
            raise aiohttp.web.HTTPNotFound(reason=str(e) or None) from e
        except WebhookError as e:
            raise aiohttp.web.HTTPBadRequest(reason=str(e) or None) from e
        return aiohttp.web.json_response(response)
