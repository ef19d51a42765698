"""Scale-out add-ons on the test control plane: the real LeaderWorkerSet controller, and the real CRDs of
LWS, KEDA and the Gateway API Inference Extension, all from their Go modules (tests/cluster/build.sh
`lws` / `addons`; nothing third-party is committed).

The LWS controller runs as a local process against the full tier (kube-controller-manager makes the
StatefulSets' pods, kwok runs them). Its webhooks (the pod webhook labels group pods and injects
LWS_LEADER_ADDRESS / LWS_WORKER_INDEX) need TLS: internal certificate management is switched off in
its configuration file, the webhook server gets the control plane's 127.0.0.1 serving certificate, and
the webhook configurations call https://127.0.0.1:<port> with the test CA. The pod webhooks are scoped
to pods carrying the LWS name label, so other tests' pods never depend on this process.

No pytest dependency (like controlplane.py).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controlplane import BUILD_SH, ControlPlane, ControlPlaneError, _tail, build_paths, free_port, wait_started

LWS_CRDS = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
)
KEDA_CRDS = ("config/crd/bases/keda.sh_scaledobjects.yaml",)
GIE_CRDS = ("config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",)
KSERVE_LLMISVC_CRDS = ("config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml",)
POLICY_REPORT_CRDS = ("policy-report/crd/v1alpha2/wgpolicyk8s.io_policyreports.yaml",)
WEBHOOK_CONFIG = "gdn-test-lws"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


class _CRDLoader(yaml.SafeLoader):
    """SafeLoader that reads a plain `=` as the string "=" (PyYAML's value tag, which SafeLoader refuses;
    the Prometheus Operator's CRDs list it among relabeling actions)."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


@dataclass(frozen=True)
class AddonPaths:
    lws_manager: Path
    lws_src: Path | None
    keda_src: Path | None
    gie_src: Path | None
    versions: dict[str, str]
    kserve_src: Path | None = None
    wgpolicy_src: Path | None = None


def find_addons(build: bool = True) -> AddonPaths:
    """Paths from build.sh; with build=True, fetch the modules and build the LWS controller if needed."""
    kv = build_paths("lws" if build else None)

    def p(key: str) -> Path | None:
        return Path(kv[key]) if kv.get(key) else None

    return AddonPaths(
        lws_manager=Path(kv["LWS_MANAGER"]),
        lws_src=p("LWS_SRC"),
        keda_src=p("KEDA_SRC"),
        gie_src=p("GIE_SRC"),
        versions={k: kv[k] for k in ("LWS_VERSION", "KEDA_VERSION", "GIE_VERSION", "KSERVE_VERSION", "WGPOLICY_VERSION")},
        kserve_src=p("KSERVE_SRC"),
        wgpolicy_src=p("WGPOLICY_SRC"),
    )


def install_crds(api: Any, src: Path | None, files: tuple[str, ...], timeout: float = 30.0) -> list[str]:
    """Create (or replace) CRDs from a module source tree and wait until they are Established and served."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if src is None or not src.is_dir():
        raise ControlPlaneError(f"module source {src} missing; run {BUILD_SH} addons")
    ext = client.ApiextensionsV1Api(api)
    names = []
    for rel in files:
        crd = yaml.load((src / rel).read_text(), Loader=_CRDLoader)  # noqa: S506  (a SafeLoader subclass)
        name = crd["metadata"]["name"]
        try:
            cur = ext.read_custom_resource_definition(name)
            crd["metadata"]["resourceVersion"] = cur.metadata.resource_version
            ext.replace_custom_resource_definition(name, crd)
        except ApiException as e:
            if e.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            c = ext.read_custom_resource_definition(name)
            if any(x.type == "Established" and x.status == "True" for x in (c.status.conditions or [])):
                break
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not Established")
            time.sleep(0.1)
    return names


class LWSController:
    """The real LeaderWorkerSet controller (sigs.k8s.io/lws cmd/) as a process against `cp`."""

    def __init__(self, cp: ControlPlane, paths: AddonPaths, workdir: Path) -> None:
        self.cp, self.paths, self.workdir = cp, paths, Path(workdir)
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "lws-controller.log"
        self.webhook_port = free_port()
        self.health_port = free_port()

    def start(self, timeout: float = 90.0) -> LWSController:
        if not (self.paths.lws_manager.is_file()):
            raise ControlPlaneError(f"{self.paths.lws_manager} missing; run {BUILD_SH} lws")
        with self.cp.api_client() as api:
            install_crds(api, self.paths.lws_src, LWS_CRDS)
        certs = self.workdir / "lws-certs"
        certs.mkdir(parents=True, exist_ok=True)
        pki = self.cp.workdir / "pki"  # the control plane's CA and its 127.0.0.1 serving certificate
        shutil.copy(pki / "apiserver.crt", certs / "tls.crt")
        shutil.copy(pki / "apiserver.key", certs / "tls.key")
        cfg = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
        }
        cfg_path = self.workdir / "lws-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = self.cp.env()
        log = open(self.log, "ab")  # noqa: SIM115 - the controller process writes to it for its whole life
        self.proc = subprocess.Popen(
            [str(self.paths.lws_manager), f"--config={cfg_path}", f"--kubeconfig={self.cp.kubeconfig}", "--zap-log-level=info"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._wait_ready(timeout)
        self._register_webhooks()
        return self

    def _wait_ready(self, timeout: float) -> None:
        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1):
                    return True
            except OSError:
                return False

        wait_started(self.proc, listening, "lws controller (webhook server)", self.log, timeout)

    def _hook(self, name: str, path: str, group: str, resource: str, ops: list[str], scoped: bool) -> dict[str, Any]:
        import base64

        ca = base64.b64encode((self.cp.workdir / "pki" / "ca.crt").read_bytes()).decode()
        hook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": 10,
            "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ops, "resources": [resource]}],
        }
        if scoped:
            hook["objectSelector"] = {"matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]}
        return hook

    def _register_webhooks(self) -> None:
        from kubernetes import client

        lws_group = "leaderworkerset.x-k8s.io"
        mutating = {
            "metadata": {"name": WEBHOOK_CONFIG},
            "webhooks": [
                self._hook(
                    "mleaderworkerset.kb.io",
                    "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                    lws_group,
                    "leaderworkersets",
                    ["CREATE", "UPDATE"],
                    False,
                ),
                self._hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"], True),
            ],
        }
        validating = {
            "metadata": {"name": WEBHOOK_CONFIG},
            "webhooks": [
                self._hook(
                    "vleaderworkerset.kb.io",
                    "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                    lws_group,
                    "leaderworkersets",
                    ["CREATE", "UPDATE"],
                    False,
                ),
                self._hook("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"], True),
            ],
        }
        with self.cp.api_client() as api:
            adm = client.AdmissionregistrationV1Api(api)
            _delete_webhooks(adm)
            adm.create_mutating_webhook_configuration(mutating)
            adm.create_validating_webhook_configuration(validating)

    def stop(self) -> None:
        import os
        import signal

        try:
            with self.cp.api_client() as api:
                from kubernetes import client

                _delete_webhooks(client.AdmissionregistrationV1Api(api))
        except Exception:  # noqa: BLE001 - the control plane may already be gone
            pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log, n)


def _delete_webhooks(adm: Any) -> None:
    from kubernetes.client.rest import ApiException

    for fn in (adm.delete_mutating_webhook_configuration, adm.delete_validating_webhook_configuration):
        try:
            fn(WEBHOOK_CONFIG)
        except ApiException as e:
            if e.status != 404:
                raise
