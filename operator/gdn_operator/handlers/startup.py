"""Operator start-up: kopf settings, the admission webhook server with its TLS, the metrics endpoint.

`configure` is the body of the startup handler (registered in handlers/main.py): it gets the settings
parsed once (gdn_operator/settings.py) and the runtime that carries them (handlers/runtime.py).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import kopf
from prometheus_client import start_http_server

from gdn_operator import telemetry
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.guard.admission import GUARD_WEBHOOK_ID, GuardAdmission
from gdn_operator.handlers.server.reconcile import ANNOTATION_PREFIX, HandledSpecs
from gdn_operator.handlers.webhook import certs, configs
from gdn_operator.handlers.webhook.limits import BoundedWebhookServer
from gdn_operator.settings import Settings


class Host(Protocol):
    """What start-up reads and records on the runtime (handlers/runtime.py)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def handled(self) -> HandledSpecs: ...

    webhook_renewal: dict[str, Any]
    metrics_started: bool
    guard_admission: GuardAdmission

    def start(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> asyncio.Task[None]: ...


log = logging.getLogger(__name__)


class ServiceWebhookServer(BoundedWebhookServer):
    """kopf's HTTPS webhook server, advertised to the API server through a Service (in-cluster)."""

    def __init__(self, *, service_name: str, service_namespace: str, service_port: int = 443, **kw: Any):
        super().__init__(**kw)
        self.service_name = service_name
        self.service_namespace = service_namespace
        self.service_port = service_port

    def advertised(self, client_config: Any) -> Any:
        return configs.service_client_config(
            self.service_name, self.service_namespace, self.service_port, self.path, client_config.get("caBundle")
        )


def webhook_server(cfg: Settings, renewal: dict[str, Any]) -> kopf.WebhookServer | None:
    """The admission webhook server for the configured mode (None: off). In service mode without cert-manager,
    `renewal` is filled with where the operator-managed certificate lives (renewed by the runtime's task)."""
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
            addr=cfg.webhook_addr,
            port=cfg.webhook_port,
            host=host,
            certfile=str(crt),
            pkeyfile=str(key),
            cafile=str(ca),
            front=cfg.webhook_process == "own",
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
            renewal.update(namespace=ns, secret=secret, sans=sans, directory=d)
        return ServiceWebhookServer(
            service_name=svc,
            service_namespace=ns,
            addr=cfg.webhook_addr,
            port=cfg.webhook_port,
            certfile=str(crt),
            pkeyfile=str(key),
            cafile=str(ca),
            file_check_interval=60.0,
            front=cfg.webhook_process == "own",
        )
    raise kopf.PermanentError(f"GDN_WEBHOOK_MODE={cfg.webhook_mode!r}: use local, service, or leave empty")


RENEW_CHECK_SECONDS = 12 * 3600


async def renew_webhook_certificate_forever(renewal: dict[str, Any]) -> None:
    """Re-check the Secret twice a day: ensure_secret_bundle renews a serving certificate within 30 days of
    expiry (or a changed SAN list); the new files are picked up by kopf's webhook server (file watch)."""
    while True:
        await asyncio.sleep(RENEW_CHECK_SECONDS)
        try:
            bundle = await asyncio.to_thread(certs.ensure_secret_bundle, renewal["namespace"], renewal["secret"], renewal["sans"])
            if (Path(renewal["directory"]) / "tls.crt").read_bytes() != bundle.cert_pem:
                bundle.write(Path(renewal["directory"]))
                log.info("webhook certificate renewed")
        except Exception as e:  # noqa: BLE001 - try again at the next check
            log.warning("webhook certificate renewal check failed: %s", e)


def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, rt: Host) -> kopf.WebhookServer | None:
    """kopf's settings, the thread pool and the metrics endpoint; returns the webhook server (None: off)."""
    cfg = rt.settings
    # Keep kopf's bookkeeping out of status so the status schema stays strict and ours: its progress (a retried
    # handler) in annotations, the last spec handled in memory (reconcile.HandledSpecs: no write per change).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = rt.handled
    settings.persistence.finalizer = "serving.gdn-operator.io/kopf-finalizer"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = cfg.max_workers
    kube.size_connection_pool(cfg.max_workers)  # as many pooled API connections as worker threads
    # A handler that fails on a passing fault (API server restarting: connection refused, 503) is retried
    # after this many seconds; kopf's default of 60 s kept servers unreconciled ~46 s after the API server
    # was back (bench/bench_faults.py, restart phase).
    settings.execution.default_backoff = 10
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    if cfg.peering:  # name, priority and standalone are set by __main__ via kopf.run()
        settings.peering.mandatory = True
        # the failover time: a standby resumes when the dead replica's last keep-alive expires (kopf renews
        # it 5-10 s before the lifetime ends); kopf's 60 s default leaves servers unreconciled for up to a minute
        settings.peering.lifetime = cfg.peering_lifetime
        settings.peering.clusterwide = not cfg.namespaces
    server = webhook_server(cfg, rt.webhook_renewal)
    if server is not None:
        if cfg.webhook_configs == "shipped":  # the chart's configurations: point their clientConfig only
            settings.admission.server = configs.ShippedConfigurations(
                server, config_name=cfg.webhook_config_name, namespaces=cfg.namespaces
            )
        else:  # kopf creates the configurations and owns their webhooks (needs create RBAC)
            settings.admission.server = server
            settings.admission.managed = cfg.webhook_config_name
        if rt.webhook_renewal:
            rt.start(lambda: renew_webhook_certificate_forever(rt.webhook_renewal), "webhook-certificate-renewal")
        if isinstance(server, BoundedWebhookServer) and cfg.guards:  # GDNGuard admission: its own path and configuration
            server.routes[GUARD_WEBHOOK_ID] = rt.guard_admission.answer
            server.on_publish.append(rt.guard_admission.published)
            rt.start(rt.guard_admission.run, "guard-admission-scope")
    # Blocking Kubernetes calls of all handlers run in this pool (asyncio.to_thread); log streams have
    # their own pool (the runtime's log_pool) so long reads never starve status writes.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="gdn-api"))
    if cfg.metrics_prometheus:
        logger.info("engine counters: read from Prometheus %s, one query per round for all engines", cfg.metrics_prometheus)
    else:
        logger.info("engine counters: scraped from each engine's /metrics")
    if cfg.metrics_port and not rt.metrics_started:
        start_http_server(cfg.metrics_port, registry=telemetry.METRICS_REGISTRY)
        rt.metrics_started = True
        logger.info("operator metrics on :%d/metrics", cfg.metrics_port)
    logger.info(
        "gdn-operator starting: default policy %s, namespaces %s, webhook %s%s",
        cfg.default_policy,
        ",".join(cfg.namespaces) or "all",
        cfg.webhook_mode or "off",
        f" (configurations {cfg.webhook_configs} {cfg.webhook_config_name})" if cfg.webhook_mode else "",
    )
    return server
