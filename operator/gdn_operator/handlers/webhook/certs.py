"""Webhook TLS: a self-signed CA and serving certificate, generated and rotated by the operator.

In a cluster without cert-manager the operator keeps the CA and the serving pair in a Secret (so all
replicas serve the same certificate and the caBundle is stable across restarts), renews the serving
certificate when it nears expiry, and kopf writes the CA into the webhook configurations' caBundle.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

import kubernetes
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID
from kubernetes.client.exceptions import ApiException

from gdn_operator.handlers.core.kube import Retry, api_client, retrying

log = logging.getLogger(__name__)

CA_DAYS = 3650
CERT_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass
class TLSBundle:
    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path) -> tuple[Path, Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        ca, crt, key = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
        ca.write_bytes(self.ca_pem)
        crt.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return ca, crt, key


#: private keys that can sign a certificate (a key loaded from the Secret could be any kind)
_ISSUER_KEY_TYPES = (
    ec.EllipticCurvePrivateKey,
    rsa.RSAPrivateKey,
    dsa.DSAPrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(common_name: str = "gdn-operator-webhook-ca") -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving_cert(ca_pem: bytes, ca_key_pem: bytes, sans: list[str], days: int = CERT_DAYS) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, _ISSUER_KEY_TYPES):
        raise TypeError(
            f"the webhook CA key is a {type(ca_key).__name__}, which cannot sign certificates; "
            "delete the webhook Secret to have a new CA made"
        )
    key = _key()
    alt: list[x509.GeneralName] = []
    for s in sans:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(s)))
        except ValueError:
            alt.append(x509.DNSName(s))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def needs_renewal(cert_pem: bytes, sans: list[str], at: dt.datetime | None = None) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    at = at or _now()
    if cert.not_valid_after_utc - at < RENEW_BEFORE:
        return True
    try:
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    names = {str(v) for v in have.get_values_for_type(x509.DNSName)} | {str(v) for v in have.get_values_for_type(x509.IPAddress)}
    return not set(sans) <= names


def new_bundle(sans: list[str]) -> TLSBundle:
    ca, ca_key = make_ca()
    crt, key = make_serving_cert(ca, ca_key, sans)
    return TLSBundle(ca, ca_key, crt, key)


def ensure_secret_bundle(namespace: str, secret: str, sans: list[str]) -> TLSBundle:
    """Load the bundle from the Secret, creating or renewing it as needed (races resolved by the API)."""
    core = kubernetes.client.CoreV1Api(api_client())
    try:
        return retrying(lambda _attempt: _ensure_once(core, namespace, secret, sans), 5)
    except ApiException as e:
        if e.status != 409:
            raise
        raise RuntimeError(f"could not create or renew the webhook Secret {namespace}/{secret}") from None


def _ensure_once(core: kubernetes.client.CoreV1Api, namespace: str, secret: str, sans: list[str]) -> TLSBundle:
    """One attempt of ensure_secret_bundle; raises Retry when another replica wrote the Secret meanwhile."""
    try:
        obj = core.read_namespaced_secret(secret, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
        bundle = new_bundle(sans)
        body = {
            "metadata": {"name": secret, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "gdn-operator"}},
            "type": "kubernetes.io/tls",
            "data": _encode(bundle),
        }
        try:
            # the V1Secret the client's validate_call would make of the dict
            core.create_namespaced_secret(namespace, kubernetes.client.V1Secret.model_validate(body))
            log.info("created webhook CA and certificate in Secret %s/%s", namespace, secret)
            return bundle
        except ApiException as e2:
            if e2.status == 409:
                raise Retry(e2) from e2  # another replica won the race; read theirs
            raise
    data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
    if not {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(data):
        ca, ca_key = make_ca()
    else:
        ca, ca_key = data["ca.crt"], data["ca.key"]
        if not needs_renewal(data["tls.crt"], sans) and not _ca_expiring(ca):
            return TLSBundle(ca, ca_key, data["tls.crt"], data["tls.key"])
        if _ca_expiring(ca):
            ca, ca_key = make_ca()
    crt, key = make_serving_cert(ca, ca_key, sans)
    bundle = TLSBundle(ca, ca_key, crt, key)
    encoded: dict[str, bytes | str] = dict(_encode(bundle))
    obj.data = encoded
    try:
        core.replace_namespaced_secret(secret, namespace, obj)
        log.info("renewed webhook certificate in Secret %s/%s", namespace, secret)
        return bundle
    except ApiException as e:
        if e.status == 409:
            raise Retry(e) from e
        raise


def _ca_expiring(ca_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(ca_pem)
    return cert.not_valid_after_utc - _now() < RENEW_BEFORE


def _encode(b: TLSBundle) -> dict[str, str]:
    def enc(v: bytes) -> str:
        return base64.b64encode(v).decode()

    return {"ca.crt": enc(b.ca_pem), "ca.key": enc(b.ca_key_pem), "tls.crt": enc(b.cert_pem), "tls.key": enc(b.key_pem)}
