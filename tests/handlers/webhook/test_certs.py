"""Webhook TLS material: a CA that signs a serving cert the stdlib TLS stack accepts."""

import datetime as dt
import ssl
import socket
import threading

import pytest

from cryptography import x509

from gdn_operator.handlers.webhook import certs


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
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert certs.needs_renewal(bundle.cert_pem, ["svc.ns.svc"], at=soon)  # inside 30 days of expiry
    assert certs.needs_renewal(b"garbage", ["x"])
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    assert cert.issuer == x509.load_pem_x509_certificate(bundle.ca_pem).subject


def test_ca_key_that_cannot_sign_is_refused_by_name():
    """A CA key in the Secret that cannot sign certificates (here X25519) fails with the key type and the fix."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import x25519

    ca_pem, _ = certs.make_ca()
    bad = x25519.X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(TypeError, match="X25519PrivateKey, which cannot sign certificates; delete the webhook Secret"):
        certs.make_serving_cert(ca_pem, bad, ["gdn-operator.svc"])
