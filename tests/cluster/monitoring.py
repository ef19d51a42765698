"""A real monitoring stack on the test control plane (issue 28): the Prometheus Operator built from the
Go module proxy (tests/cluster/build.sh `promop`), its real CRDs from the same module, and the real
Prometheus server (github.com/prometheus/prometheus cmd/prometheus, build.sh `prometheus`: Debian's package,
which gives the tests promtool, is built without Kubernetes service discovery) running the configuration
the Prometheus Operator generated.

In a cluster the Prometheus Operator writes the configuration into the Secret ``prometheus-<name>``
(``prometheus.yaml.gz``) and the rules into ConfigMaps ``prometheus-<name>-rulefiles-<n>``; the kubelet
mounts them into the Prometheus pod and the config-reloader sidecar expands ``$(POD_NAME)`` and
``$(SHARD)`` (the sharding `keep` rule drops every target until it is expanded). Outside the
cluster, `localize()` does what those mounts do, and makes ONE change to the configuration itself:
every ``kubernetes_sd_configs`` entry gets ``kubeconfig_file`` (the test API server's admin kubeconfig),
because in-cluster service discovery reads the pod's service-account token and KUBERNETES_SERVICE_HOST,
which do not exist here. Everything else (jobs, relabelings, selectors, rule files) runs as generated.

A ServiceMonitor reaches its targets through the Service's EndpointSlices (or Endpoints), and the API server
rejects loopback addresses in both ("may not be in the loopback range (127.0.0.0/8, ::1/128)"), so a Service
over a kwok pod with a 127.x IP (the test cluster's pod range, tests/cluster/controlplane.py POD_CIDR) has no
endpoints and its ServiceMonitor job no target. `ServiceHostNode` gives the pod behind the chart's metrics
Service a non-loopback address instead: a tainted kwok node whose pod range starts at that address (PodMonitors
use the pod role, which reads pod IPs directly, so the engines keep their 127.x IPs). The address lives on `lo`
of a private network namespace the live test makes for itself (tests/integration/test_monitoring_live.py),
never on an interface of the machine.

No pytest dependency (like controlplane.py and addons.py).
"""

from __future__ import annotations

import base64
import gzip
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from addons import install_crds
from controlplane import BUILD_SH, ControlPlane, ControlPlaneError, _tail, build_paths, free_port, http_ok, wait_started

CRD_DIR = "example/prometheus-operator-crd"
CRDS = tuple(
    f"{CRD_DIR}/monitoring.coreos.com_{p}.yaml"
    for p in (
        "alertmanagerconfigs",
        "alertmanagers",
        "podmonitors",
        "probes",
        "prometheusagents",
        "prometheuses",
        "prometheusrules",
        "scrapeconfigs",
        "servicemonitors",
        "thanosrulers",
    )
)
IN_CLUSTER_RULES = "/etc/prometheus/rules/"


@dataclass(frozen=True)
class MonitoringPaths:
    operator: Path
    src: Path | None
    version: str
    prometheus: Path


def find_monitoring(build: bool = True) -> MonitoringPaths:
    """Paths from build.sh; with build=True, build the Prometheus Operator and Prometheus if needed."""
    kv = build_paths("monitoring" if build else None)
    paths = MonitoringPaths(
        Path(kv["PROMETHEUS_OPERATOR"]),
        Path(kv["PROMOP_SRC"]) if kv.get("PROMOP_SRC") else None,
        kv["PROMOP_VERSION"],
        Path(kv["PROMETHEUS"]),
    )
    for p in (paths.operator, paths.prometheus):
        if not p.is_file():
            raise ControlPlaneError(f"{p} missing; run {BUILD_SH} monitoring")
    return paths


def prometheus_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    return "v" + out.split("version ", 1)[1].split()[0]


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class PrometheusOperator:
    """The real Prometheus Operator (cmd/operator) as a process against `cp`, with its real CRDs."""

    def __init__(self, cp: ControlPlane, paths: MonitoringPaths, workdir: Path) -> None:
        self.cp, self.paths, self.workdir = cp, paths, Path(workdir)
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "prometheus-operator.log"
        self.port = free_port()

    def start(self, timeout: float = 60.0) -> PrometheusOperator:
        if not self.paths.operator.is_file():
            raise ControlPlaneError(f"{self.paths.operator} missing; run {BUILD_SH} promop")
        with self.cp.api_client() as api:
            install_crds(api, self.paths.src, CRDS, timeout=60)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.paths.operator), f"--web.listen-address=127.0.0.1:{self.port}", "--log-level=info"],
                env=self.cp.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.port}/healthz"
        wait_started(self.proc, lambda: http_ok(url), "prometheus-operator", self.log, timeout)
        return self

    def stop(self) -> None:
        _stop(self.proc)


def generated_config(api: Any, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The configuration the Prometheus Operator generated for Prometheus `name`, and its rule files
    (file name -> content), or None while the Secret does not exist yet."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    try:
        sec = core.read_namespaced_secret(f"prometheus-{name}", namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise

    cfg = yaml.safe_load(gzip.decompress(base64.b64decode(sec.data["prometheus.yaml.gz"])))
    rules: dict[str, str] = {}
    for cm in core.list_namespaced_config_map(namespace).items:
        if cm.metadata.name.startswith(f"prometheus-{name}-rulefiles-"):
            for key, text in (cm.data or {}).items():
                rules[f"{cm.metadata.name}/{key}"] = text
    return cfg, rules


def localize(cfg: dict[str, Any], rules: dict[str, str], kubeconfig: Path, workdir: Path, pod_name: str) -> Path:
    """Write `cfg` for a Prometheus outside the cluster; returns the config file path (see module doc)."""
    # what the config-reloader does: expand $(POD_NAME) and $(SHARD) (shard 0 of 1) in the whole file
    text = json.dumps(cfg).replace("$(POD_NAME)", pod_name).replace("$(SHARD)", "0")
    cfg = json.loads(text)
    rule_dir = workdir / "rules"
    shutil.rmtree(rule_dir, ignore_errors=True)
    for rel, text in rules.items():  # what the kubelet mounts from the rulefiles ConfigMaps
        (rule_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (rule_dir / rel).write_text(text)
    cfg["rule_files"] = [f.replace(IN_CLUSTER_RULES, f"{rule_dir}/") for f in cfg.get("rule_files") or []]
    for job in cfg.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            sd["kubeconfig_file"] = str(kubeconfig)  # THE change: SD against the test API server
    path = workdir / "prometheus.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class ServiceHostNode:
    """A kwok node whose pods get `ip` (a non-loopback address on `lo` of the test's own network namespace) as their IP,
    so the EndpointSlice of a Service over them is valid (see module doc). Tainted: only pods that tolerate
    `TAINT` land on it (give them `node_selector()` and `tolerations()`). kwok hands out a node's pod IPs from
    `spec.podCIDR` starting at its network address + 1, so the range is `<ip - 1>/32`: its first pod gets
    `ip`; callers check the pod's IP (one pod per node)."""

    TAINT = "gdn-operator.io/test-service-host"

    def __init__(self, api: Any, name: str, ip: str, fake_annotation: tuple[str, str]) -> None:
        self.api, self.name, self.ip, self.fake_annotation = api, name, ip, fake_annotation

    def create(self, timeout: float = 60.0) -> ServiceHostNode:
        from kubernetes import client

        cap = {"cpu": "8", "memory": "32Gi", "pods": "10", "ephemeral-storage": "100Gi"}
        v1 = client.CoreV1Api(self.api)
        v1.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": self.name,
                    "annotations": {self.fake_annotation[0]: self.fake_annotation[1]},
                    "labels": {
                        "kubernetes.io/hostname": self.name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "spec": {
                    "podCIDR": f"{ipaddress.IPv4Address(self.ip) - 1}/32",
                    "taints": [{"key": self.TAINT, "value": "true", "effect": "NoSchedule"}],
                },
                "status": {"capacity": cap, "allocatable": cap},
            }
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = v1.read_node(self.name)
            if any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])):
                return self
            time.sleep(0.5)
        raise ControlPlaneError(f"kwok node {self.name} not Ready after {timeout}s")

    def node_selector(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": self.name}

    def tolerations(self) -> list[dict[str, str]]:
        return [{"key": self.TAINT, "operator": "Exists", "effect": "NoSchedule"}]

    def delete(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CoreV1Api(self.api).delete_node(self.name)
        except ApiException as e:
            if e.status != 404:
                raise


class PrometheusServer:
    """The real Prometheus server on a localized configuration; `query`, `alerts`, `targets` read its API."""

    def __init__(self, binary: Path, config: Path, workdir: Path) -> None:
        self.binary, self.config, self.workdir = binary, config, Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.binary),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--log.level=info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"},
            )
        wait_started(self.proc, lambda: http_ok(f"{self.url}/-/ready"), "prometheus", self.log, timeout)
        return self

    def reload(self) -> None:
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def api(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=120) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise ControlPlaneError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets", state="active")["activeTargets"]

    def stop(self) -> None:
        _stop(self.proc)

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log, n)
