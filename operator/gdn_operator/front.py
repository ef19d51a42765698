"""The webhook front: the admission webhook server in a process of its own (GDN_WEBHOOK_PROCESS=own, the default).

Why: the operator's process runs kopf's event loop and the reconciles, and its Python threads share one GIL. Under a
burst of creates every admission answer waited behind that work. At 100 paced creates/s on a 2-core machine
(`bench/bench_admission.py --rate 100 --corpus valid --rounds 2 --floor --compare-tree OLD`, OLD a tree where the
operator's process answers), 88.5 % and 93.5 % of the answers from the operator's process came within 100 ms, 98.3 % and
93.6 % from this process, and 98.1 % and 96.9 % from a do-nothing webhook in its own process, in the same run.

This process owns the webhook port. It answers the validating webhook of GDNModelServers itself: the same function the
operator's process runs (handlers/webhook/admission.py), with the settings parsed from the same environment and a CRD cache
of its own, after the same size and nesting bounds (handlers/webhook/limits.py). Every other request (the opt-in
mutating webhook, the GDNGuard webhook, a review it does not recognise) goes unchanged to kopf's server in the
operator's process, which then listens on the loopback only (handlers/webhook/frontprocess.py starts this process).

What it shares with the operator's process:

* the certificate files: it re-reads them every CERT_CHECK_SECONDS and serves the new pair when they changed (the
  operator renews its own; cert-manager rotates a mounted one);
* the admission counters (gdn_admission_decisions_total): what it counted goes to its stdout as a JSON line at most
  every REPORT_SECONDS, and the operator's process adds it to the counters its /metrics serves;
* its life: it ends when its stdin closes, that is when the operator's process ended, however it ended.

    python -m gdn_operator.front --listen ADDR:PORT --backend PORT --cert F --key F --ca F [--path P]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import signal
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import aiohttp.web
import kopf

from gdn_operator import GROUP, PLURAL, VERSION, telemetry
from gdn_operator.handlers.core.heap import settle_heap
from gdn_operator.handlers.core.kube import CrdCache
from gdn_operator.handlers.core.tasks import supervised
from gdn_operator.handlers.webhook import admission
from gdn_operator.handlers.webhook.limits import ReviewGate, precheck, review_answer
from gdn_operator.settings import Settings, process_settings

log = logging.getLogger(__name__)

#: how often the counters are reported to the operator's process (when something was counted)
REPORT_SECONDS = 0.2
#: how often the certificate files are read again (kopf's server behind it, every 60 s in service mode: startup.py)
CERT_CHECK_SECONDS = 10.0
#: how long a request passed to the operator's process may take (the API server waits 10 s at most: handlers/webhook/configs.py)
FORWARD_TIMEOUT_SECONDS = 30.0
#: the first line on stdout once the port is open
READY = {"ready": True}
#: the most counter changes one report line carries (the operator's process reads lines of up to READ_LIMIT bytes)
REPORT_CHUNK = 200


@dataclass
class FrontFacts:
    """What admission reads besides the object (handlers/plan.ClusterFacts), held by this process."""

    settings: Settings
    crds: CrdCache


def decision_counts() -> dict[tuple[str, str, str], float]:
    """This process's admission counters: (namespace, decision, rule) -> count."""
    out: dict[tuple[str, str, str], float] = {}
    for metric in telemetry.ADMISSION_DECISIONS.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[(s.labels["namespace"], s.labels["decision"], s.labels["rule"])] = s.value
    return out


class Front:
    """The front's requests: the GDNModelServer validation answered here, the rest passed to `backend`."""

    def __init__(self, facts: FrontFacts, *, backend: str, cert: str, key: str, ca: str, path: str = "") -> None:
        self.facts = facts
        self.backend = backend.rstrip("/")
        self.cert, self.key, self.ca = cert, key, ca
        self.prefix = path.rstrip("/")
        self.server_context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        self.server_context.load_cert_chain(cert, key)
        # kopf's server behind: its certificate is checked against every CA these files held while this process ran
        # (kopf reloads a renewed pair later than this process does), not its name (it names the Service or host)
        self.client_context = ssl.create_default_context(cafile=ca)
        self.client_context.check_hostname = False
        self.session: aiohttp.ClientSession | None = None
        self.reported: dict[tuple[str, str, str], float] = {}
        self.counted = False
        self.gate = ReviewGate()

    def app(self) -> aiohttp.web.Application:
        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.post(f"{self.prefix}/{{id:.*}}", self.handle)])
        return app

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        async with self.gate.turn(request) as raw:  # bounded size, read deadline, reviews in flight (handlers/webhook/limits.py)
            return await self._handle(request, raw)

    async def _handle(self, request: aiohttp.web.Request, raw: bytes) -> aiohttp.web.Response:
        if request.match_info.get("id") == admission.VALIDATE_ID:
            review, deny = precheck(raw.decode("utf-8", errors="replace"))
            if deny is not None:
                return deny
            answer = await self.answer(review)
            if answer is not None:
                return aiohttp.web.json_response(answer)
        return await self.forward(request, raw)

    async def answer(self, review: dict[str, Any] | None) -> dict[str, Any] | None:
        """The answer to a GDNModelServer review, or None for any other review (the operator's kopf answers it as
        it would have: an unknown resource, a review without its user or object, a subresource)."""
        req = review.get("request") if isinstance(review, dict) else None
        if review is None or not isinstance(req, dict):
            return None
        res = req.get("resource")
        if not isinstance(res, dict) or (res.get("group"), res.get("version"), res.get("resource")) != (GROUP, VERSION, PLURAL):
            return None
        if req.get("subResource"):
            return None
        new, old = req.get("object"), req.get("oldObject")
        raw_body = new if new is not None else old
        if req.get("userInfo") is None or not isinstance(raw_body, dict) or not isinstance(old, (dict, type(None))):
            return None
        warnings: list[str] = []
        status: dict[str, Any] | None = None
        # whatever the operation: kopf runs a validating handler for every review its webhook gets (the configurations
        # send CREATE and UPDATE; a DELETE carries only the old object, whose spec is then unchanged: admitted)
        body = kopf.Body(cast(kopf.RawBody, raw_body))  # the views kopf hands its handlers
        old_body = kopf.Body(cast(kopf.RawBody, old)) if old is not None else None
        namespace, name = body.metadata.namespace, body.metadata.name
        try:
            await admission.admit(body.spec, warnings, namespace, name, old_body, self.facts)
        except kopf.AdmissionError as e:
            status = {"message": str(e) or repr(e), "code": e.code or 500}
        except Exception as e:  # as kopf answers a failed handler: refused with its message, code 500
            log.exception("admission of %s/%s failed", namespace, name)
            status = {"message": str(e) or repr(e), "code": 500}
        self.counted = True
        return review_answer(review, str(req.get("uid", "")), warnings, status)

    async def forward(self, request: aiohttp.web.Request, raw: bytes) -> aiohttp.web.Response:
        """The request as it came, to kopf's server in the operator's process; its answer as it came back."""
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.client_context),
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_SECONDS),
            )
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            async with self.session.post(self.backend + request.rel_url.path_qs, data=raw, headers=headers) as r:
                body = await r.read()
                out_headers = {"Content-Type": r.headers.get("Content-Type", "application/json")}
                return aiohttp.web.Response(status=r.status, reason=r.reason, body=body, headers=out_headers)
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("webhook front: the operator's webhook server did not answer %s: %s", request.rel_url.path, e)
            raise aiohttp.web.HTTPBadGateway(reason="the operator's webhook server did not answer") from None

    def report(self) -> str:
        """What was counted since the last report, as JSON lines of at most REPORT_CHUNK changes ("" when nothing)."""
        counts = decision_counts()
        delta = [[*k, v - self.reported.get(k, 0.0)] for k, v in sorted(counts.items()) if v != self.reported.get(k, 0.0)]
        self.reported = counts
        chunks = [delta[i : i + REPORT_CHUNK] for i in range(0, len(delta), REPORT_CHUNK)]
        return "".join(json.dumps({"decisions": c}) + "\n" for c in chunks)

    async def report_forever(self, out: asyncio.WriteTransport) -> None:
        """Report every REPORT_SECONDS what was counted. Never blocks: while the operator's process has not read the
        last report, the counts wait (they are cumulative: the next report carries them)."""
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            if self.counted and out.get_write_buffer_size() == 0:
                self.counted = False
                lines = self.report()
                if lines:
                    out.write(lines.encode())

    def _digest(self) -> str:
        h = hashlib.sha256()
        for p in (self.cert, self.key, self.ca):
            h.update(Path(p).read_bytes())
        return h.hexdigest()

    async def reload_certificates_forever(self) -> None:
        """Serve a renewed pair: new handshakes get it (the open connections keep theirs)."""
        digest = self._digest()
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            try:
                now = self._digest()
                if now == digest:
                    continue
                # a pair half written (the certificate new, the key old) must not reach the served context
                ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert, self.key)
                self.server_context.load_cert_chain(self.cert, self.key)  # new handshakes get it
                self.client_context.load_verify_locations(cafile=self.ca)  # added to the CAs trusted before
            except (OSError, ssl.SSLError) as e:  # read again next time
                log.warning("webhook front: certificate files not readable yet: %s", e)
                continue
            digest = now
            log.info("webhook front: serving the renewed certificate from %s", self.cert)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class _StdinWatch(asyncio.Protocol):
    """Sets `stop` when stdin closes: the operator's process holds its other end until it ends."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop.set()


async def serve(front: Front, addr: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await loop.connect_read_pipe(lambda: _StdinWatch(stop), sys.stdin)
    runner = aiohttp.web.AppRunner(front.app(), handle_signals=False, access_log=None)
    await runner.setup()
    # reuse_port as kopf's server: replicas on one host share the port (tests, local mode)
    site = aiohttp.web.TCPSite(runner, addr or None, port, ssl_context=front.server_context, reuse_port=True, reuse_address=True)
    await site.start()
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    out.write((json.dumps(READY) + "\n").encode())
    running = [
        asyncio.create_task(supervised(lambda: front.report_forever(out), "report"), name="report"),
        asyncio.create_task(supervised(front.reload_certificates_forever, "certificates"), name="certificates"),
    ]
    # the operator's process logs the INFO line (frontprocess.py) once it has read READY
    log.debug("listening on %s:%d: answers %s, passes the rest to %s", addr or "*", port, admission.VALIDATE_ID, front.backend)
    try:
        await stop.wait()
    finally:
        for t in running:
            t.cancel()
        await runner.cleanup()
        await front.close()
        lines = front.report()  # what was counted since the last report
        if lines:
            out.write(lines.encode())
        for _ in range(50):  # the operator's process reads it (1 s at most: it may be ending too)
            if out.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.02)
        out.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdn_operator.front", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="ADDR:PORT the API server calls")
    ap.add_argument("--backend", type=int, required=True, help="the loopback port of kopf's server in the operator's process")
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--path", default="")
    a = ap.parse_args(argv)
    cfg = process_settings("gdn-operator webhook front")
    if cfg is None:
        return 2
    addr, _, port = a.listen.rpartition(":")
    try:
        front = Front(
            FrontFacts(cfg, CrdCache()), backend=f"https://127.0.0.1:{a.backend}", cert=a.cert, key=a.key, ca=a.ca, path=a.path
        )
    except (OSError, ssl.SSLError) as e:
        print(f"gdn-operator webhook front: the certificate files {a.cert}, {a.key}, {a.ca}: {e}", file=sys.stderr)
        return 2
    settle_heap()
    asyncio.run(serve(front, addr, int(port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
