"""Operator start-up: kopf settings, the admission webhook server with its TLS, the metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator

import kopf
from prometheus_client import start_http_server

from gdn_operator import telemetry
from gdn_operator.handlers import certs
from gdn_operator.handlers.config import OperatorConfig, get_config
from gdn_operator.handlers.reconcile import ANNOTATION_PREFIX, DIFFBASE
from gdn_operator.handlers.webhook_limits import BoundedWebhookServer

log = logging.getLogger(__name__)



class ServiceWebhookServer(BoundedWebhookServer):
    """kopf's HTTPS webhook server, advertised to the API server through a Service (in-cluster)."""

    def __init__(self, *, service_name: str, service_namespace: str, service_port: int = 443, **kw: Any):
        super().__init__(**kw)
        self.service_name = service_name
        self.service_namespace = service_namespace
        self.service_port = service_port

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for cfg in super().__call__(fn):
            out: dict[str, Any] = {
                "service": {
                    "name": self.service_name,
                    "namespace": self.service_namespace,
                    "port": self.service_port,
                    "path": (self.path or "").rstrip("/"),
                }
            }
            if "caBundle" in cfg:
                out["caBundle"] = cfg["caBundle"]
            yield out


def webhook_server(cfg: OperatorConfig) -> kopf.WebhookServer | None:
    if not cfg.webhook_mode:
        return None
    if cfg.webhook_mode == "local":
        host = cfg.webhook_host or "127.0.0.1"
        d = Path(tempfile.mkdtemp(prefix="gdn-webhook-"))
        if cfg.webhook_secret and cfg.webhook_namespace:
            # replicas sharing one port (SO_REUSEPORT) must also share one CA
            bundle = certs.ensure_secret_bundle(cfg.webhook_namespace, cfg.webhook_secret, [host, "localhost"])
        else:
            bundle = certs.new_bundle([host, "localhost"])
        ca, crt, key = bundle.write(d)
        return BoundedWebhookServer(
            addr=cfg.webhook_addr, port=cfg.webhook_port, host=host, certfile=str(crt), pkeyfile=str(key), cafile=str(ca)
        )
    if cfg.webhook_mode == "service":
        if not cfg.webhook_service or not cfg.webhook_namespace:
            raise kopf.PermanentError("GDN_WEBHOOK_MODE=service needs GDN_WEBHOOK_SERVICE and GDN_WEBHOOK_NAMESPACE")
        svc, ns = cfg.webhook_service, cfg.webhook_namespace
        if cfg.webhook_cert_dir:  # cert-manager mounted a Certificate's Secret
            d = Path(cfg.webhook_cert_dir)
            ca, crt, key = d / "ca.crt", d / "tls.crt", d / "tls.key"
        else:
            sans = [f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local", svc]
            secret = cfg.webhook_secret or f"{svc}-tls"
            bundle = certs.ensure_secret_bundle(ns, secret, sans)
            d = Path(tempfile.mkdtemp(prefix="gdn-webhook-"))
            ca, crt, key = bundle.write(d)
            _RENEWAL.update(namespace=ns, secret=secret, sans=sans, directory=d)
        return ServiceWebhookServer(
            service_name=svc,
            service_namespace=ns,
            addr=cfg.webhook_addr,
            port=cfg.webhook_port,
            certfile=str(crt),
            pkeyfile=str(key),
            cafile=str(ca),
            file_check_interval=60.0,
        )
    raise kopf.PermanentError(f"GDN_WEBHOOK_MODE={cfg.webhook_mode!r}: use local, service, or leave empty")


_metrics_started = False
#: where the operator-managed webhook certificate lives (service mode without cert-manager)
_RENEWAL: dict[str, Any] = {}
RENEW_CHECK_SECONDS = 12 * 3600


async def renew_webhook_certificate_forever() -> None:
    """Re-check the Secret twice a day: ensure_secret_bundle renews a serving certificate within 30 days of
    expiry (or a changed SAN list); the new files are picked up by kopf's webhook server (file watch)."""
    while True:
        await asyncio.sleep(RENEW_CHECK_SECONDS)
        try:
            bundle = await asyncio.to_thread(
                certs.ensure_secret_bundle, _RENEWAL["namespace"], _RENEWAL["secret"], _RENEWAL["sans"]
            )
            if (Path(_RENEWAL["directory"]) / "tls.crt").read_bytes() != bundle.cert_pem:
                bundle.write(Path(_RENEWAL["directory"]))
                log.info("webhook certificate renewed")
        except Exception as e:  # noqa: BLE001 - try again at the next check
            log.warning("webhook certificate renewal check failed: %s", e)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    global _metrics_started
    cfg = get_config()
    # Keep kopf's bookkeeping in annotations so the status schema stays strict and ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = DIFFBASE
    settings.persistence.finalizer = "serving.gdn-operator.io/kopf-finalizer"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = cfg.max_workers
    # A handler that fails on a passing fault (API server restarting: connection refused, 503) is retried
    # after this many seconds; kopf's default of 60 s kept servers unreconciled ~46 s after the API server
    # was back (bench/bench_faults.py, restart phase).
    settings.execution.default_backoff = 10
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    if os.environ.get("GDN_PEERING"):  # name, priority and standalone are set by __main__ via kopf.run()
        settings.peering.mandatory = True
        settings.peering.clusterwide = not cfg.namespaces
    server = webhook_server(cfg)
    if server is not None:
        settings.admission.server = server
        settings.admission.managed = cfg.webhook_config_name
        if _RENEWAL:
            asyncio.get_running_loop().create_task(renew_webhook_certificate_forever())
    # Blocking Kubernetes calls of all handlers run in this pool (asyncio.to_thread); log streams have
    # their own pool (crashwatch.LOG_POOL) so long reads never starve status writes.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="gdn-api")
    )
    if cfg.metrics_port and not _metrics_started:
        start_http_server(cfg.metrics_port, registry=telemetry.REGISTRY)
        _metrics_started = True
        logger.info("operator metrics on :%d/metrics", cfg.metrics_port)
    logger.info(
        "gdn-operator starting: default policy %s, namespaces %s, webhook %s",
        cfg.default_policy,
        ",".join(cfg.namespaces) or "all",
        cfg.webhook_mode or "off",
    )
