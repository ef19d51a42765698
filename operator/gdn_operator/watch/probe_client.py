"""HTTP side of the output probes: greedy /v1/completions requests to engine pods.

One aiohttp session (keep-alive pool) for all servers and rounds; at most ``concurrency`` requests in
flight; each request bounded by its own timeout, measured from when it gets a slot. Never raises for a
broken pod (only cancellation propagates): failures come back as :class:`~gdn_operator.watch.probes.Asked`
with ``error`` in {"auth" (HTTP 401/403), "timeout", "connect", "http", "parse"}.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from gdn_operator.api.probes import Probe
from gdn_operator.watch.probes import Answer, Asked

MAX_BODY = 1 << 20
_HEADERS = {"Content-Type": "application/json", "User-Agent": "gdn-operator-probe"}


def request_body(model: str, probe: Probe) -> dict[str, Any]:
    """The completion request for one probe: greedy, no sampling noise, token ids returned."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(probe.prompt_token_ids) if probe.prompt_token_ids is not None else probe.prompt,
        "max_tokens": probe.max_tokens,
        "temperature": 0.0,
        "n": 1,
        "stream": False,
        "return_token_ids": True,  # vLLM >= 0.10.2: choices[].token_ids
    }
    if probe.stop:
        body["stop"] = list(probe.stop)
    return body


def parse_answer(payload: Any) -> Answer:
    """Answer from a /v1/completions response body (ValueError when it is not one)."""
    try:
        choice = payload["choices"][0]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no choices in the response ({type(e).__name__})") from None
    ids = choice.get("token_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
        raise ValueError("choices[0].token_ids is not a list of integers")
    text = choice.get("text")
    return Answer(tuple(ids) if ids is not None else None, text if isinstance(text, str) else "", choice.get("finish_reason"))


def completions_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/v1/completions"


class ProbeClient:
    """Sends probes; holds the shared session. Use as an async context manager or call close()."""

    def __init__(self, concurrency: int = 64):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ProbeClient:
        self._ensure()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency, limit_per_host=0, keepalive_timeout=90.0, enable_cleanup_closed=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers=_HEADERS, timeout=aiohttp.ClientTimeout(total=None)
            )
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def ask(self, url: str, model: str, probe: Probe, pod: str, timeout: float, api_key: str | None = None) -> Asked:
        session = self._ensure()
        sem = self._sem
        if sem is None:  # _ensure creates both
            raise RuntimeError("ProbeClient has a session but no semaphore")
        async with sem:
            t0 = time.perf_counter()
            error = message = None
            answer = None
            try:
                async with asyncio.timeout(timeout):
                    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
                    async with session.post(
                        url, data=json.dumps(request_body(model, probe)), headers=headers, allow_redirects=False
                    ) as resp:
                        raw = await resp.content.read(MAX_BODY + 1)
                        if resp.status in (401, 403):  # the engine wants an API key (spec.apiKeySecret)
                            error = "auth"
                            message = f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace').strip()}"
                        elif resp.status != 200:
                            error = "http"
                            message = f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace').strip()}"
                        elif len(raw) > MAX_BODY:
                            error, message = "http", f"response larger than {MAX_BODY} bytes"
                        else:
                            try:
                                answer = parse_answer(json.loads(raw))
                            except ValueError as e:
                                error, message = "parse", str(e).splitlines()[0][:200]
            except TimeoutError:
                error, message = "timeout", f"no answer within {timeout:g}s"
            except (aiohttp.ClientError, OSError) as e:
                error, message = "connect", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            except Exception as e:  # noqa: BLE001 - a broken pod must never break the round
                error, message = "connect", f"{type(e).__name__}: {e}"[:200]
            return Asked(pod, probe.name, answer, error, message or "", time.perf_counter() - t0)

    async def ask_pod(
        self, url: str, model: str, probes: list[Probe], pod: str, timeout: float, api_key: str | None = None
    ) -> list[Asked]:
        """One pod's round: the probes one after another (batch size 1 keeps greedy answers reproducible);
        `api_key` goes as `Authorization: Bearer` (engines of a server with spec.apiKeySecret)."""
        return [await self.ask(url, model, p, pod, timeout, api_key) for p in probes]
