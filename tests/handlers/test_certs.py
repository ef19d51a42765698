"""Webhook TLS material: a CA that signs a serving cert the stdlib TLS stack accepts."""

import datetime as dt
import ssl
import socket
import threading

from cryptography import x509

from gdn_operator.handlers import certs


def test_bundle_verifies_with_stdlib_tls(tmp_path):
    bundle = certs.new_bundle(["127.0.0.1", "localhost"])
    ca, crt, key = bundle.write(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    client_ctx = ssl.create_default_context(cafile=str(ca))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as s:
            s.sendall(b"ok")

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with client_ctx.wrap_socket(raw, server_hostname="localhost") as s:
            assert s.recv(2) == b"ok"
    t.join()
    srv.close()


def test_renewal_rules():
    bundle = certs.new_bundle(["svc.ns.svc"])
    assert not certs.needs_renewal(bundle.cert_pem, ["svc.ns.svc"])
    assert certs.needs_renewal(bundle.cert_pem, ["other.ns.svc"])  # SANs changed
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=340)
    assert certs.needs_renewal(bundle.cert_pem, ["svc.ns.svc"], at=soon)  # inside 30 days of expiry
    assert certs.needs_renewal(b"garbage", ["x"])
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    assert cert.issuer == x509.load_pem_x509_certificate(bundle.ca_pem).subject
