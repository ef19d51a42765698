"""Operator-wide settings, from the environment (the Helm chart sets these)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


def _positive_int(name: str, default: int) -> int:
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name}={v!r}: must be a positive integer (chart value operator.maxWorkers)")
    return n


@dataclass(frozen=True)
class OperatorConfig:
    #: admission policy when a GDNModelServer does not set spec.admissionPolicy
    default_policy: str = "reject"
    #: namespaces to watch; empty = all namespaces
    namespaces: tuple[str, ...] = ()
    #: webhook server: "" disables it (the reconciler still checks every change)
    webhook_mode: str = ""  # "", "local" (URL to this process), "service" (in-cluster Service)
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str | None = None
    webhook_service: str | None = None  # name of the Service in front of the webhook (service mode)
    webhook_namespace: str | None = None
    webhook_cert_dir: str | None = None  # mounted cert-manager certificate (tls.crt/tls.key/ca.crt)
    webhook_secret: str | None = None  # Secret the operator keeps its self-signed CA + cert in
    webhook_config_name: str = "gdn-operator.serving.gdn-operator.io"
    metrics_port: int = 8080
    #: create PodMonitors when the monitoring.coreos.com CRD exists
    pod_monitors: bool = True
    #: crash watch: stream logs of running engine containers (bounded)
    stream_logs: bool = True
    #: Prometheus the KEDA ScaledObjects query (chart autoscaling.keda.prometheusAddress); "" = HPA only
    keda_prometheus_address: str = ""
    #: watch LeaderWorkerSets (multi-node engines) / InferencePools (chart lws.enabled, inferencePool.enabled)
    lws: bool = True
    inference_pool: bool = True
    #: manage HorizontalPodAutoscalers (chart scaleOut.autoscaling.hpa.enabled)
    hpa: bool = True
    #: threads for the handlers' blocking API calls (and as many pooled connections). A burst of creates
    #: keeps every one busy waiting for the API server (bench/bench_reconcile.py with --py-spy): 16 → 64
    #: halved p50 / cut p99 to 0.36x at load ~9 and 0.91x / 0.76x at load ~4.5 (--compare-env, same run)
    max_workers: int = 64
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "OperatorConfig":
        ns = tuple(n.strip() for n in os.environ.get("GDN_WATCH_NAMESPACES", "").split(",") if n.strip())
        policy = os.environ.get("GDN_DEFAULT_POLICY", "reject").strip() or "reject"
        if policy not in ("reject", "mitigate", "warn"):
            raise ValueError(f"GDN_DEFAULT_POLICY={policy!r}: must be reject, mitigate or warn")
        return cls(
            default_policy=policy,
            namespaces=ns,
            webhook_mode=os.environ.get("GDN_WEBHOOK_MODE", "").strip(),
            webhook_addr=os.environ.get("GDN_WEBHOOK_ADDR", "0.0.0.0"),
            webhook_port=int(os.environ.get("GDN_WEBHOOK_PORT", "9443")),
            webhook_host=os.environ.get("GDN_WEBHOOK_HOST") or None,
            webhook_service=os.environ.get("GDN_WEBHOOK_SERVICE") or None,
            webhook_namespace=os.environ.get("GDN_WEBHOOK_NAMESPACE") or os.environ.get("POD_NAMESPACE") or None,
            webhook_cert_dir=os.environ.get("GDN_WEBHOOK_CERT_DIR") or None,
            webhook_secret=os.environ.get("GDN_WEBHOOK_SECRET") or None,
            webhook_config_name=os.environ.get("GDN_WEBHOOK_CONFIG_NAME", "gdn-operator.serving.gdn-operator.io"),
            metrics_port=int(os.environ.get("GDN_METRICS_PORT", "8080")),
            pod_monitors=_bool("GDN_POD_MONITORS", True),
            stream_logs=_bool("GDN_STREAM_LOGS", True),
            keda_prometheus_address=os.environ.get("GDN_KEDA_PROMETHEUS_ADDRESS", "").strip(),
            lws=_bool("GDN_LWS", True),
            inference_pool=_bool("GDN_INFERENCE_POOL", True),
            hpa=_bool("GDN_HPA", True),
            max_workers=_positive_int("GDN_MAX_WORKERS", 64),
        )


_config: OperatorConfig | None = None


def get_config() -> OperatorConfig:
    global _config
    if _config is None:
        _config = OperatorConfig.from_env()
    return _config
