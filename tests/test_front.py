"""The webhook front without a cluster: the operator's webhook server with `front=True` starts the real front process,
which answers GDNModelServer validation itself and passes the rest to kopf's server behind it; its counts reach the
operator's process; it ends with the server. (Through the API server: tests/integration/test_webhook_front.py.)"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from builders import server_review

from controlplane import port_refuses
from gdn_operator import telemetry
from gdn_operator.handlers.webhook import admission
from gdn_operator.handlers.webhook import certs
from gdn_operator.handlers.webhook.frontprocess import FrontError, FrontProcess
from gdn_operator.handlers.webhook.limits import BoundedWebhookServer, free_loopback_port, review_answer, with_port
from gdn_operator.front import Front


def review(spec: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return server_review(spec, uid, namespace="front-test")


FINE = {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "t", "vllmVersion": "0.32.0"}}
REFUSED = {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "t", "vllmVersion": "0.17.1"}, "admissionPolicy": "reject"}


def denied_count(rule: str) -> float:
    return (
        telemetry.METRICS_REGISTRY.get_sample_value(
            "gdn_admission_decisions_total", {"namespace": "front-test", "decision": "denied", "rule": rule}
        )
        or 0.0
    )


def test_with_port_replaces_only_the_port():
    assert with_port("https://127.0.0.1:41234/x/y", 9443) == "https://127.0.0.1:9443/x/y"
    assert with_port("https://host.example/p", 8443) == "https://host.example:8443/p"
    assert with_port("https://[::1]:1/p", 2) == "https://[::1]:2/p"


def test_the_answer_has_kopfs_shape():
    r = review(FINE)
    assert review_answer(r, "u", [], None) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": True},
    }
    refused = review_answer({}, "u", ["w"], {"message": "no", "code": 403})["response"]
    assert refused == {"uid": "u", "allowed": False, "warnings": ["w"], "status": {"message": "no", "code": 403}}


def test_the_operators_process_adds_what_the_front_reports():
    fp = FrontProcess(addr="127.0.0.1", port=1, backend=2, cert="c", key="k", ca="a")
    before = denied_count("r-1")
    assert fp._read(b'{"ready": true}\n') == "ready"
    assert fp._read(b'{"decisions": [["front-test", "denied", "r-1", 2.0]]}\n') == "counts"
    assert fp._read(b"a stray line\n") == ""
    assert fp._read(b'{"decisions": [["front-test", "denied"]]}\n') == ""  # malformed: logged, never raised
    assert fp._read(b"[1, 2]\n") == ""
    assert denied_count("r-1") == before + 2.0


def test_the_front_reports_only_what_changed(tmp_path):
    c = _bundle(tmp_path)
    front = Front(None, backend="https://127.0.0.1:1", cert=c["cert"], key=c["key"], ca=c["ca"])  # type: ignore[arg-type]
    front.report()  # whatever this process counted before
    telemetry.ADMISSION_DECISIONS.labels("front-test", "denied", "r-2").inc()
    telemetry.ADMISSION_DECISIONS.labels("front-test", "denied", "r-2").inc()
    assert json.loads(front.report()) == {"decisions": [["front-test", "denied", "r-2", 2.0]]}
    assert front.report() == ""


def test_a_report_of_many_changes_comes_in_lines_the_operator_reads(tmp_path, monkeypatch):
    from gdn_operator import front

    monkeypatch.setattr(front, "REPORT_CHUNK", 2)
    c = _bundle(tmp_path)
    front = Front(None, backend="https://127.0.0.1:1", cert=c["cert"], key=c["key"], ca=c["ca"])  # type: ignore[arg-type]
    front.report()
    for rule in ("c-1", "c-2", "c-3"):
        telemetry.ADMISSION_DECISIONS.labels("front-test", "warned", rule).inc()
    lines = front.report().splitlines()
    assert [len(json.loads(ln)["decisions"]) for ln in lines] == [2, 1]
    fp = FrontProcess(addr="127.0.0.1", port=1, backend=2, cert="c", key="k", ca="a")
    sample = {"namespace": "front-test", "decision": "warned", "rule": "c-3"}
    before = telemetry.METRICS_REGISTRY.get_sample_value("gdn_admission_decisions_total", sample) or 0.0
    assert [fp._read(ln.encode()) for ln in lines] == ["counts", "counts"]
    assert telemetry.METRICS_REGISTRY.get_sample_value("gdn_admission_decisions_total", sample) == before + 1.0


def _bundle(d: Path) -> dict[str, str]:
    ca, crt, key = certs.new_bundle(["127.0.0.1", "localhost"]).write(d)
    return {"cert": str(crt), "key": str(key), "ca": str(ca)}


async def _post(session: aiohttp.ClientSession, port: int, path: str, body: Any) -> tuple[int, Any]:
    async with session.post(f"https://127.0.0.1:{port}{path}", json=body) as r:
        return r.status, await r.json()


@pytest.mark.timeout(120)
async def test_the_server_with_a_front_answers_validation_there_and_passes_the_rest_on(tmp_path, monkeypatch):
    monkeypatch.setenv("GDN_WEBHOOK_MODE", "")  # the front parses the settings from the environment it inherits
    port = free_loopback_port()
    server = BoundedWebhookServer(addr="127.0.0.1", port=port, host="127.0.0.1", front=True, **_file_args(tmp_path))
    assert server.port != port and server.addr == "127.0.0.1"  # kopf's server: a loopback port behind the front
    seen: list[str | None] = []

    async def fn(request: Any, *, webhook: str | None = None, **_: Any) -> dict[str, Any]:  # kopf's side
        seen.append(webhook)
        return review_answer(request, request["request"]["uid"], [], None)

    async with server:  # as kopf runs it (kopf/_core/engines/admission.py): its exit closes the server
        cfg = await asyncio.wait_for(server(fn).__anext__(), 90)
        assert cfg["url"] == f"https://127.0.0.1:{port}"  # the API server is told the front's port
        ctx = ssl.create_default_context(cafile=_file_args(tmp_path)["cafile"])
        before = denied_count("vllm#36917")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            status, answer = await _post(session, port, f"/{admission.VALIDATE_ID}", review(REFUSED, uid="u-2"))
            assert status == 200 and answer["response"]["allowed"] is False and answer["response"]["uid"] == "u-2"
            assert "vllm#36917" in answer["response"]["status"]["message"] and answer["response"]["status"]["code"] == 403
            status, answer = await _post(session, port, f"/{admission.VALIDATE_ID}", review(FINE))
            assert status == 200 and answer["response"]["allowed"] is True
            assert seen == []  # validation never reached the operator's process
            status, answer = await _post(session, port, "/guard-admission", review(FINE, uid="u-3"))
            assert status == 200 and answer["response"] == {"uid": "u-3", "allowed": True}
            assert seen == ["guard-admission"]
        for _ in range(100):  # the front reports every REPORT_SECONDS
            if denied_count("vllm#36917") == before + 1:
                break
            await asyncio.sleep(0.1)
        assert denied_count("vllm#36917") == before + 1
        front = server.front
        assert front is not None and front.proc is not None and front.proc.returncode is None
    assert front.proc.returncode is not None  # kopf stopped its server: the front ended with it
    assert port_refuses(port)


def _file_args(d: Path) -> dict[str, str]:
    if not (d / "tls.crt").exists():
        _bundle(d)
    return {"certfile": str(d / "tls.crt"), "pkeyfile": str(d / "tls.key"), "cafile": str(d / "ca.crt")}


def test_a_front_needs_certificate_files():
    with pytest.raises(ValueError, match="certificate files"):
        BoundedWebhookServer(addr="127.0.0.1", port=9443, front=True)


@pytest.mark.timeout(60)
async def test_the_front_serves_a_renewed_certificate(tmp_path, monkeypatch):
    """The operator renews its certificate (handlers/webhook/certs.py) and cert-manager rotates a mounted one: the front
    reads the files again and new connections get the new pair."""
    from gdn_operator import front

    monkeypatch.setattr(front, "CERT_CHECK_SECONDS", 0.05)
    c = _bundle(tmp_path)
    front = Front(None, backend="https://127.0.0.1:1", cert=c["cert"], key=c["key"], ca=c["ca"])  # type: ignore[arg-type]
    runner = aiohttp.web.AppRunner(front.app())
    await runner.setup()
    port = free_loopback_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port, ssl_context=front.server_context).start()
    reload = asyncio.create_task(front.reload_certificates_forever())

    async def served_by(ca: str) -> bool:
        ctx = ssl.create_default_context(cafile=ca)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        except ssl.SSLCertVerificationError:
            return False
        writer.close()
        return True

    try:
        assert await served_by(c["ca"])
        first_ca = Path(c["ca"]).read_bytes()
        renewed = tmp_path / "renewed"
        ca, crt, key = certs.new_bundle(["127.0.0.1", "localhost"]).write(renewed)
        Path(c["cert"]).write_bytes(crt.read_bytes())  # as the operator rewrites its files (startup.py renewal)
        Path(c["key"]).write_bytes(key.read_bytes())
        Path(c["ca"]).write_bytes(ca.read_bytes())
        for _ in range(100):
            if await served_by(str(ca)):
                break
            await asyncio.sleep(0.05)
        assert await served_by(str(ca))
        old_ca = tmp_path / "old-ca.crt"
        old_ca.write_bytes(first_ca)
        assert not await served_by(str(old_ca))  # the old pair is no longer served
    finally:
        reload.cancel()
        await runner.cleanup()
        await front.close()


@pytest.mark.timeout(120)
async def test_a_front_that_cannot_start_is_an_error_and_nothing_is_left_running(tmp_path, monkeypatch):
    monkeypatch.setenv("GDN_WEBHOOK_MODE", "")
    fp = FrontProcess(addr="127.0.0.1", port=free_loopback_port(), backend=1, cert=str(tmp_path / "none.crt"), key="k", ca="a")
    with pytest.raises(FrontError, match="exited with 2 before it listened"):
        await fp.ensure_started()
    assert fp.proc is not None and fp.proc.returncode == 2


@pytest.mark.timeout(120)
async def test_stop_leaves_no_front_even_while_one_is_being_restarted(tmp_path, monkeypatch):
    """A front killed from outside is started again by the supervisor; stop() then (whether the restart already
    happened or is still waiting) ends the supervisor before the process, so no front outlives it."""
    import gdn_operator.handlers.webhook.frontprocess as fpm

    monkeypatch.setenv("GDN_WEBHOOK_MODE", "")
    monkeypatch.setattr(fpm, "RESTART_SECONDS", 0.01)
    files = _file_args(tmp_path)
    port = free_loopback_port()
    fp = FrontProcess(addr="127.0.0.1", port=port, backend=1, cert=files["certfile"], key=files["pkeyfile"], ca=files["cafile"])
    await fp.ensure_started()
    first = fp.proc
    assert first is not None
    first.kill()
    for _ in range(600):  # restarted (a fresh import takes a second or two)
        if fp.proc is not first and fp.proc is not None and fp.starts == 2:
            break
        await asyncio.sleep(0.01)
    second = fp.proc
    assert second is not first and fp.starts == 2
    second.kill()  # and again: stop() now races the supervisor's restart
    await fp.stop()
    assert fp.supervisor is not None and fp.supervisor.done()
    assert fp.proc is not None and fp.proc.returncode is not None
    assert port_refuses(port)


def test_forged_namespaces_grow_no_series_and_report_lines_stay_under_the_read_limit(tmp_path, monkeypatch):
    """Issue 48: the counter's namespace label came from the review's body (any caller of the webhook port can
    forge it): random namespaces grew series without bound, and a long one could push a report line past the
    operator's 1 MiB read limit. Label values come from a bounded set, so a report line is bounded too."""
    from gdn_operator import front as front_module
    from gdn_operator.handlers.webhook import frontprocess

    monkeypatch.setattr(telemetry, "_admission_namespaces", set())  # (the other tests' namespaces stay countable)
    c = _bundle(tmp_path)
    front = Front(None, backend="https://127.0.0.1:1", cert=c["cert"], key=c["key"], ca=c["ca"])  # type: ignore[arg-type]
    front.report()
    for i in range(telemetry.MAX_ADMISSION_NAMESPACES + 300):
        telemetry.admission_decision(f"forged-{i}", "denied", "r-f").inc()
    telemetry.admission_decision("x" * (2 << 20), "denied", "r-f").inc()  # a 2 MiB "namespace"
    telemetry.admission_decision("Not_A_Namespace", "denied", "r" * 5000).inc()
    namespaces = {
        s.labels["namespace"]
        for m in telemetry.ADMISSION_DECISIONS.collect()
        for s in m.samples
        if s.labels["rule"].startswith("r-f") or s.labels["rule"].startswith("rrr")
    }
    assert len(namespaces) <= telemetry.MAX_ADMISSION_NAMESPACES + 2  # + "_other", "_invalid"
    assert {"_other", "_invalid"} <= namespaces
    lines = front.report().splitlines()
    worst = len(json.dumps({"decisions": [["a" * 63, "mitigated", "r" * 128, 1e18]] * front_module.REPORT_CHUNK}))
    assert worst < frontprocess.READ_LIMIT
    assert lines and all(len(ln) <= worst for ln in lines)
