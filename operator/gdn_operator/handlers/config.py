"""Operator-wide settings, from the environment (the Helm chart sets these)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


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
    #: "managed" (kopf creates the configurations) or "shipped" (the chart does; see handlers/webhookconfigs.py)
    webhook_configs: str = "managed"
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
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "OperatorConfig":
        ns = tuple(n.strip() for n in os.environ.get("GDN_WATCH_NAMESPACES", "").split(",") if n.strip())
        policy = os.environ.get("GDN_DEFAULT_POLICY", "reject").strip() or "reject"
        if policy not in ("reject", "mitigate", "warn"):
            raise ValueError(f"GDN_DEFAULT_POLICY={policy!r}: must be reject, mitigate or warn")
        mode = os.environ.get("GDN_WEBHOOK_MODE", "").strip()
        configs = os.environ.get("GDN_WEBHOOK_CONFIGS", "").strip() or ("shipped" if mode == "service" else "managed")
        if configs not in ("managed", "shipped"):
            raise ValueError(f"GDN_WEBHOOK_CONFIGS={configs!r}: must be managed (the operator creates the webhook "
                             "configurations) or shipped (the chart installs them; the operator patches clientConfig)")
        return cls(
            default_policy=policy,
            namespaces=ns,
            webhook_mode=mode,
            webhook_addr=os.environ.get("GDN_WEBHOOK_ADDR", "0.0.0.0"),
            webhook_port=int(os.environ.get("GDN_WEBHOOK_PORT", "9443")),
            webhook_host=os.environ.get("GDN_WEBHOOK_HOST") or None,
            webhook_service=os.environ.get("GDN_WEBHOOK_SERVICE") or None,
            webhook_namespace=os.environ.get("GDN_WEBHOOK_NAMESPACE") or os.environ.get("POD_NAMESPACE") or None,
            webhook_cert_dir=os.environ.get("GDN_WEBHOOK_CERT_DIR") or None,
            webhook_secret=os.environ.get("GDN_WEBHOOK_SECRET") or None,
            webhook_config_name=os.environ.get("GDN_WEBHOOK_CONFIG_NAME", "gdn-operator.serving.gdn-operator.io"),
            webhook_configs=configs,
            metrics_port=int(os.environ.get("GDN_METRICS_PORT", "8080")),
            pod_monitors=_bool("GDN_POD_MONITORS", True),
            stream_logs=_bool("GDN_STREAM_LOGS", True),
            keda_prometheus_address=os.environ.get("GDN_KEDA_PROMETHEUS_ADDRESS", "").strip(),
            lws=_bool("GDN_LWS", True),
            inference_pool=_bool("GDN_INFERENCE_POOL", True),
            hpa=_bool("GDN_HPA", True),
        )


_config: OperatorConfig | None = None


def get_config() -> OperatorConfig:
    global _config
    if _config is None:
        _config = OperatorConfig.from_env()
    return _config
