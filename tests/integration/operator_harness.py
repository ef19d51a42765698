"""Run the real operator (a `python -m gdn_operator` process) against the test control plane.

Used by the integration tests: start/stop/kill the operator, install the generated CRD, wait for
conditions, read the operator's /metrics.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any
from collections.abc import Callable

import kubernetes
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.api.crd import crd_manifest

WEBHOOK_CONFIG = "gdn-operator-test.serving.gdn-operator.io"


import waiting  # noqa: E402  (tests/ is on sys.path: the rootdir conftest)
from builders import GMS  # noqa: E402
from controlplane import free_port  # noqa: E402,F401  (tests/cluster is on sys.path via tests/conftest.py)


def _not_yet(e: BaseException) -> bool:
    """An object that does not exist yet (404) or a write that lost a race (409): poll again."""
    return isinstance(e, ApiException) and e.status in (404, 409)


def wait_for(fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25, what: str = "condition") -> Any:
    """``waiting.wait_for`` that treats a 404/409 from the API server as "not yet"."""
    return waiting.wait_for(fn, timeout, interval, what, retry=_not_yet)


def metric(text: str, name: str, absent: float | None = None, **labels: str) -> float | None:
    """The sum of the samples of `name` in the Prometheus text `text` whose labels include `labels`;
    `absent` when no sample matches."""
    total, found = 0.0, False
    for m in re.finditer(r"^" + re.escape(name) + r"(?:\{([^}]*)\})? (\S+)$", text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(lab.get(k) == v for k, v in labels.items()):
            total, found = total + float(m.group(2)), True
    return total if found else absent


def apiserver_requests(cp: Any, code: str | None = None) -> dict[str, float]:
    """kube-apiserver's apiserver_request_total, summed per "VERB resource[/subresource]" (all codes, or only
    `code`): what a test or benchmark counts the operator's requests with (bench/bench_reconcile.py, issue 37)."""
    with urllib.request.urlopen(f"{cp.server}/metrics", timeout=30, context=cp.ssl_context()) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r"^apiserver_request_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if code is not None and labels.get("code") != code:
            continue
        key = f"{labels.get('verb')} {labels.get('resource')}" + (
            f"/{labels['subresource']}" if labels.get("subresource") else ""
        )
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def install_crd(api: kubernetes.client.ApiClient, crd: dict[str, Any] | None = None) -> None:
    """Create or replace the GDNModelServer CRD (this tree's, or `crd`: another commit's, bench/bench_fuzz.py)."""
    ext = kubernetes.client.ApiextensionsV1Api(api)
    crd = copy.deepcopy(crd) if crd is not None else crd_manifest()
    try:
        existing = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = existing.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    except ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(crd)

    def established() -> bool:
        c = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(x.type == "Established" and x.status == "True" for x in (c.status.conditions or []))

    wait_for(established, 30, what="CRD Established")
    # Discovery for the new group can lag a moment behind Established.
    co = kubernetes.client.CustomObjectsApi(api)
    wait_for(lambda: co.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None, 30, what="CRD served")


class OperatorProcess:
    """The operator as a child process (its own session, so a kill takes everything)."""

    def __init__(
        self,
        cluster: Any,
        workdir: Path,
        *,
        webhook: bool = False,
        env: dict[str, str] | None = None,
        kubeconfig: Path | None = None,
    ):
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.webhook = webhook
        self.extra_env = dict(env or {})
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.proc: subprocess.Popen | None = None
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.webhook_port = free_port()
        self.log_path = self.workdir / "operator.log"
        self.starts = 0

    def start(self, wait: bool = True) -> OperatorProcess:
        env = self.cluster.env()
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            GDN_METRICS_PORT=str(self.metrics_port),
            GDN_LIVENESS=f"http://127.0.0.1:{self.liveness_port}/healthz",
            GDN_LOG_LEVEL="DEBUG",
            PYTHONUNBUFFERED="1",
        )
        if self.webhook:
            env.update(
                GDN_WEBHOOK_MODE="local",
                GDN_WEBHOOK_ADDR="127.0.0.1",
                GDN_WEBHOOK_HOST="127.0.0.1",
                GDN_WEBHOOK_PORT=str(self.webhook_port),
                GDN_WEBHOOK_CONFIG_NAME=WEBHOOK_CONFIG,
            )
        env.update(self.extra_env)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the operator process writes to it for its whole life
        log.write(f"\n===== operator start #{self.starts + 1} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gdn_operator"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.starts += 1
        if wait:
            wait_for(self.alive, 60, what=f"operator liveness (log: {self.log_path})")
        return self

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (a crash in the middle of whatever it was doing)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@contextlib.contextmanager
def running_operator(cluster: Any, api: kubernetes.client.ApiClient, workdir: Path, **kw: Any):
    """Install the CRD, run the operator for the duration of the block, always stop it."""
    install_crd(api)
    proc = OperatorProcess(cluster, workdir, **kw).start()
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def running_webhook_operator(cluster: Any, api: kubernetes.client.ApiClient, workdir: Path, **kw: Any):
    """`running_operator` with the admission webhook: the block starts once both webhook configurations
    exist and the validating one names its webhook (kopf creates the objects first and writes the webhooks once
    its server, and the webhook front before it, listen); afterwards they are deleted (a dead webhook with
    failurePolicy Fail would block later tests)."""
    adm = kubernetes.client.AdmissionregistrationV1Api(api)
    try:
        with running_operator(cluster, api, workdir, webhook=True, **kw) as proc:
            wait_for(
                lambda: adm.read_validating_webhook_configuration(WEBHOOK_CONFIG).webhooks,
                60,
                what="validating webhook configured",
            )
            wait_for(lambda: adm.read_mutating_webhook_configuration(WEBHOOK_CONFIG), 60, what="mutating webhook configured")
            yield proc
    finally:
        delete_webhook_configs(api)


def delete_webhook_configs(api: kubernetes.client.ApiClient, name: str = WEBHOOK_CONFIG) -> None:
    adm = kubernetes.client.AdmissionregistrationV1Api(api)
    for fn in (adm.delete_validating_webhook_configuration, adm.delete_mutating_webhook_configuration):
        try:
            fn(name)
        except ApiException as e:
            if e.status != 404:
                raise


#: the server the cluster tests create (namespace from the request): builders.GMS.small, a 300 s startup budget
CLUSTER_SERVER = GMS(namespace=None).small().update(startupBudgetSeconds=300)


def gms(name: str, **spec: Any) -> dict[str, Any]:
    """CLUSTER_SERVER named ``name``, ``spec`` merged in (``image={"tag": ...}`` keeps the repository)."""
    return CLUSTER_SERVER.name(name).merge(**spec).obj()


class Kube:
    """Small typed helpers over the admin client for the tests."""

    def __init__(self, api: kubernetes.client.ApiClient):
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.co = kubernetes.client.CustomObjectsApi(api)

    def create_namespace(self, name: str) -> str:
        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except ApiException as e:
            if e.status != 409:
                raise
        # the ServiceAccount admission plugin needs the namespace's default SA (made by kcm)
        wait_for(lambda: self.core.read_namespaced_service_account("default", name), 30, what=f"default SA in {name}")
        return name

    def delete_namespace(self, name: str, timeout: float = 90.0) -> None:
        """Delete a test namespace and wait until its pods are gone, so their (fake) GPUs are free for
        the next test: the session shares one cluster with 2 × 8 nvidia.com/gpu.

        kube-controller-manager's namespace controller starts deleting a namespace's content only 5 s after
        the namespace is marked for deletion (a fixed grace for HA API servers), which cost every test 5 s.
        So the pods are deleted here at once, after the namespace is Terminating (no new pod is admitted
        there, so no controller can bring one back); the namespace controller removes the rest as before."""
        try:
            self.core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise
        try:
            self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
        wait_for(lambda: not self.core.list_namespaced_pod(name).items, timeout, what=f"pods of {name} gone")

    def create(self, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj)

    def get(self, ns: str, name: str) -> dict[str, Any]:
        return self.co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def patch(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.co.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )

    def delete(self, ns: str, name: str) -> None:
        try:
            self.co.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return self.get(ns, name).get("status") or {}

    def condition(self, ns: str, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(ns, name).get("conditions") or []:
            if c.get("type") == type_:
                return c
        return None

    def wait_condition(
        self, ns: str, name: str, type_: str, status: str = "True", timeout: float = 60, reason: str | None = None
    ) -> dict[str, Any]:
        def check():
            c = self.condition(ns, name, type_)
            return c if c and c["status"] == status and (reason is None or c.get("reason") == reason) else None

        return wait_for(check, timeout, what=f"{ns}/{name} condition {type_}={status}" + (f" ({reason})" if reason else ""))

    def deployment(self, ns: str, name: str) -> Any:
        return self.apps.read_namespaced_deployment(name, ns)

    def engine_pods(self, ns: str, name: str) -> list[Any]:
        return self.core.list_namespaced_pod(ns, label_selector=f"serving.gdn-operator.io/server={name}").items

    def ready_pod(self, ns: str, name: str, not_named: str | None = None) -> Any:
        """Wait for a Ready engine pod of `ns/name` with an IP, not being deleted (and not `not_named`)."""

        def find() -> Any:
            for p in self.engine_pods(ns, name):
                ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
                if ready and p.status.pod_ip and not p.metadata.deletion_timestamp and p.metadata.name != not_named:
                    return p
            return None

        return wait_for(
            find, 90, interval=0.5, what=f"a Ready engine pod of {ns}/{name}" + (f" other than {not_named}" if not_named else "")
        )

    def events(self, ns: str, name: str, reason: str | None = None) -> list[Any]:
        evs = self.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in evs if reason is None or e.reason == reason]
