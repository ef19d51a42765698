"""A real Kubernetes control plane for gdn-operator's integration tests and dev mode.

Binaries come from ``tests/cluster/build.sh`` (etcd, kube-apiserver, and for the full tier
kube-controller-manager, kube-scheduler and kwok), built from the Go module proxy into
``${GDN_CACHE_DIR:-~/.cache/gdn-operator}/bin``.  Recipe: ../shared/docs/test-cluster.md.

Tiers
  core  etcd + kube-apiserver (envtest-style).  Admission plugins ServiceAccount and
        TaintNodesByCondition are disabled because no controller-manager runs.  No nodes.
  full  + kube-controller-manager, kube-scheduler and kwok, plus ``gpu_nodes`` fake GPU Nodes
        (``nvidia.com/gpu`` capacity) that kwok keeps Ready.  Pods get 127.x pod IPs.

Usage::

    with ControlPlane(tier="full") as cp:
        api = cp.api_client()                     # kubernetes.client.ApiClient (admin)
        tok = cp.create_token("ns", "sa")         # TokenRequest for a ServiceAccount
        cp.kubeconfig                             # admin kubeconfig path

No pytest dependency: this module is used by tests/conftest.py and hack/dev.py alike.

Why one module of ~870 lines: it is one lifecycle — the start order of up to five processes, the readiness
wait after each, the PKI and kubeconfigs they share, and the teardown that must undo exactly what started,
in reverse, even after a half-finished start. Split, that order would be spread over files that each only
make sense beside the others; the helpers above ``ControlPlane`` (binaries, PKI, kubeconfig) are the parts
that stand alone.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime as _dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
EXTRA_STAGES = HERE / "kwok" / "extra.yaml"

#: kwok stage files taken from the sigs.k8s.io/kwok module source (not copied into the repo).
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
    "kustomize/stage/pod/chaos/pod-container-running-failed.yaml",
)

#: kwok kinds configured at run time through their CRDs (so tests can say which log file a pod serves).
KWOK_RUNTIME_CRDS = ("ClusterLogs", "Logs")
KWOK_CRD_FILES = ("kustomize/crd/bases/kwok.x-k8s.io_clusterlogs.yaml", "kustomize/crd/bases/kwok.x-k8s.io_logs.yaml")

#: Pod IPs come from this range (loopback, so a stand-in server can bind them on ``lo``). One /16 per test
#: process, picked from its pid (127.44–127.243; dev mode uses 127.43): control planes of two test runs on one
#: machine gave pods the same addresses, and one run's stand-in engine answered the other's probes or took
#: its port ("Address already in use").
POD_CIDR = f"127.{44 + os.getpid() % 200}.0.0/16"
GPU_RESOURCE = "nvidia.com/gpu"
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
CRASH_ANNOTATION = "gdn-operator.io/test-crash-message"
CRASH_EXIT_CODE_ANNOTATION = "gdn-operator.io/test-crash-exit-code"
CRASH_REASON_ANNOTATION = "gdn-operator.io/test-crash-reason"
CRASH_CONTAINER_ANNOTATION = "gdn-operator.io/test-crash-container"

TIERS = ("core", "full")


class ControlPlaneError(RuntimeError):
    """A component failed to build or start; the message carries the log tail."""


# --------------------------------------------------------------------------------------------
# binaries
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_src: Path | None
    k8s_version: str
    etcd_version: str
    kwok_version: str

    def missing(self, tier: str) -> list[Path]:
        need = [self.etcd, self.kube_apiserver]
        if tier == "full":
            need += [self.kube_controller_manager, self.kube_scheduler, self.kwok]
        return [p for p in need if not (p.is_file() and os.access(p, os.X_OK))]


def _kv(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def build_paths(target: str | None = None) -> dict[str, str]:
    """``build.sh <target>`` first when given (instant when cached), then what ``build.sh paths`` prints, as a
    dict (ETCD, KUBE_APISERVER, LWS_MANAGER, PROMETHEUS, …): one reader for every tier's and add-on's paths."""
    if target is not None:
        res = subprocess.run(["bash", str(BUILD_SH), target], capture_output=True, text=True)
        if res.returncode != 0:
            raise ControlPlaneError(f"build.sh {target} failed:\n{res.stderr[-3000:]}")
    res = subprocess.run(["bash", str(BUILD_SH), "paths"], capture_output=True, text=True)
    if res.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SH} paths failed:\n{res.stderr[-2000:]}")
    return _kv(res.stdout)


def _parse_paths(kv: dict[str, str]) -> Binaries:
    src = kv.get("KWOK_SRC") or ""
    return Binaries(
        etcd=Path(kv["ETCD"]),
        kube_apiserver=Path(kv["KUBE_APISERVER"]),
        kube_controller_manager=Path(kv["KUBE_CONTROLLER_MANAGER"]),
        kube_scheduler=Path(kv["KUBE_SCHEDULER"]),
        kwok=Path(kv["KWOK"]),
        kwok_src=Path(src) if src else None,
        k8s_version=kv["K8S_VERSION"],
        etcd_version=kv["ETCD_VERSION"],
        kwok_version=kv["KWOK_VERSION"],
    )


def find_binaries() -> Binaries:
    """Where build.sh puts (or has put) the binaries; builds nothing."""
    return _parse_paths(build_paths())


def ensure_built(tier: str = "core", *, quiet: bool = False) -> Binaries:
    """Run ``build.sh <tier>`` (instant when cached) and return the binary paths.

    A cold build takes tens of minutes on 2 cores; its progress goes to stderr unless quiet.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, not {tier!r}")
    res = subprocess.run(
        ["bash", str(BUILD_SH), tier],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if quiet else None,
        text=True,
    )
    if res.returncode != 0:
        tail = (res.stderr or "")[-4000:]
        raise ControlPlaneError(f"{BUILD_SH} {tier} failed (exit {res.returncode}):\n{tail}")
    bins = _parse_paths(_kv(res.stdout))
    missing = bins.missing(tier)
    if missing:
        raise ControlPlaneError(f"{BUILD_SH} {tier} succeeded but binaries are missing: {missing}")
    return bins


# --------------------------------------------------------------------------------------------
# PKI (cryptography)
# --------------------------------------------------------------------------------------------
def _write_pki(d: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    later = now + _dt.timedelta(days=7)

    def save_key(key, name: str) -> None:
        (d / name).write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        os.chmod(d / name, 0o600)

    def save_cert(cert, name: str) -> None:
        (d / name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gdn-operator-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    save_key(ca_key, "ca.key")
    save_cert(ca, "ca.crt")

    def issue(name: str, cn: str, orgs: list[str], server: bool, client: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.DNSName("localhost"),
                    ]
                ),
                critical=False,
            )
        save_key(key, f"{name}.key")
        save_cert(b.sign(ca_key, hashes.SHA256()), f"{name}.crt")

    issue("apiserver", "kube-apiserver", [], server=True, client=False)
    issue("admin", "admin", ["system:masters"], server=False, client=True)
    issue("kwok", "kwok", [], server=True, client=False)

    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    save_key(sa, "sa.key")
    (d / "sa.pub").write_bytes(
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _kubeconfig_yaml(server: str, ca: Path, user: dict[str, str], name: str = "gdn-test") -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    }
    return json.dumps(doc, indent=2)  # JSON is valid YAML


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # pragma: no cover - non-glibc
    _libc = None


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setsid()  # own process group, so stop() can signal the whole group
    if _libc is not None:
        # If the Python process dies without running stop()/atexit (SIGKILL), the kernel
        # sends SIGKILL to the component: nothing is left behind.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_refuses(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` (a connection is refused)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except OSError:
        return True


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(data[-lines:])


def http_ok(url: str) -> bool:
    """GET `url` answers 200 (False while nothing listens or the server errs)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def wait_started(proc: subprocess.Popen[Any] | None, ready: Any, what: str, log: Path, timeout: float) -> None:
    """Poll `ready()` every 0.25 s until it holds. A process that exits first, or the timeout, raises
    ControlPlaneError with the tail of its log: one loop for every helper process the tests start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ControlPlaneError(f"{what} exited {proc.returncode}:\n{_tail(log)}")
        if ready():
            return
        time.sleep(0.25)
    raise ControlPlaneError(f"{what} not ready after {timeout}s:\n{_tail(log)}")


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path


# --------------------------------------------------------------------------------------------
# the control plane
# --------------------------------------------------------------------------------------------
class ControlPlane:
    """etcd + kube-apiserver (core), + kcm, scheduler, kwok and fake GPU nodes (full).

    Public attributes after start(): ``kubeconfig`` (Path), ``server`` (https URL),
    ``ca_file`` (Path), ``node_names`` (list[str]), ``logs`` (component -> log Path),
    ``pids`` (component -> pid), ``workdir`` (Path), ``binaries``.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        tier: str = "core",
        gpu_nodes: int = 2,
        gpus_per_node: int = 8,
        *,
        binaries: Binaries | None = None,
        start_timeout: float = 120.0,
        gpu_product: str = "NVIDIA-H100-80GB-HBM3",
        pod_cidr: str = POD_CIDR,
        node_cpu: str = "64",
        node_memory: str = "512Gi",
    ) -> None:
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, not {tier!r}")
        self.tier = tier
        self.gpu_nodes = gpu_nodes if tier == "full" else 0
        self.gpus_per_node = gpus_per_node
        self.gpu_product = gpu_product
        self.node_cpu, self.node_memory = node_cpu, node_memory  # each fake node's capacity
        self.pod_cidr = pod_cidr
        self.start_timeout = start_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gdn-cp-"))
        self.binaries = binaries
        self._procs: list[_Proc] = []
        self._tmpdirs: list[Path] = []
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ca_file = self.workdir / "pki" / "ca.crt"
        self.server = ""
        self.node_names: list[str] = []
        self.logs: dict[str, Path] = {}
        self.pids: dict[str, int] = {}
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    # ---- context manager ---------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> ControlPlane:
        if self._started:
            return self
        self._started = True
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill every component (whole process groups), wait for them, delete temp dirs.

        Safe to call more than once and after a failed or partial start().
        """
        with self._lock:
            procs, self._procs = self._procs, []
            for p in reversed(procs):  # kwok, scheduler, kcm, apiserver, etcd
                self._terminate(p)
            for d in self._tmpdirs:
                shutil.rmtree(d, ignore_errors=True)
            self._tmpdirs = []
            if self._own_workdir and self._started:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self._stopped = True
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    @staticmethod
    def _terminate(p: _Proc, grace: float = 10.0) -> None:
        pop = p.popen
        if pop.poll() is None:
            try:
                os.killpg(pop.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                pop.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # Kill whatever is left in the group (also reaps forked helpers), then reap the leader.
        try:
            os.killpg(pop.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            pop.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            pass

    def _start(self) -> None:
        if self.binaries is None:
            self.binaries = find_binaries()
        missing = self.binaries.missing(self.tier)
        if missing:
            raise ControlPlaneError(
                f"missing binaries for tier {self.tier!r}: {', '.join(map(str, missing))}; run: {BUILD_SH} {self.tier}"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        pki = self.workdir / "pki"
        t = time.monotonic()
        _write_pki(pki)
        self.timings["pki"] = time.monotonic() - t

        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        etcd_data = Path(tempfile.mkdtemp(prefix="gdn-etcd-", dir=base))
        self._tmpdirs.append(etcd_data)

        for name in ("etcd", "etcd_peer", "apiserver", "scheduler", "kwok"):
            self.ports[name] = free_port()
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        api = self.ports["apiserver"]
        self.server = f"https://127.0.0.1:{api}"

        # -- etcd
        t = time.monotonic()
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=default",
                f"--data-dir={etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: self._http_ok(f"{etcd_url}/health", b'"health":"true"'))
        self.timings["etcd"] = time.monotonic() - t

        # -- kube-apiserver
        t = time.monotonic()
        args = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/16",  # room for thousands of Services (bench_reconcile --count 500 needs 500+)
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
            "--v=1",
        ]
        if self.tier == "core":
            # No controller-manager: nothing creates default ServiceAccounts or removes the
            # node.kubernetes.io/not-ready taint.
            args.append("--disable-admission-plugins=ServiceAccount,TaintNodesByCondition")
        self._spawn("kube-apiserver", args)
        self._write_kubeconfigs(pki)
        self._wait("kube-apiserver", self._apiserver_ready)
        self.timings["kube-apiserver"] = time.monotonic() - t

        if self.tier == "full":
            self._start_full(pki)

    def _start_full(self, pki: Path) -> None:
        assert self.binaries is not None
        kc = str(self.kubeconfig)
        t = time.monotonic()
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=false",
                "--node-monitor-period=1s",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={pki / 'scheduler'}",
                "--v=1",
            ],
        )
        src = self.binaries.kwok_src
        if src is None or not src.is_dir():
            raise ControlPlaneError(f"kwok module source not found ({src}); run `go mod download` in {HERE / 'kwok'}")
        stages = [src / s for s in KWOK_STAGES] + [EXTRA_STAGES]
        for s in stages:
            if not s.is_file():
                raise ControlPlaneError(f"kwok stage file missing: {s}")
        self._install_kwok_crds(src)
        kwok_home = self.workdir / "kwok-home"  # keep ~/.kwok/kwok.yaml out of the picture
        kwok_home.mkdir(exist_ok=True)
        port = self.ports["kwok"]
        self._spawn(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={kc}",
                "--manage-nodes-with-annotation-selector=" + "=".join(FAKE_NODE_ANNOTATION),
                f"--cidr={self.pod_cidr}",
                "--node-ip=127.0.0.1",
                "--node-name=localhost",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={pki / 'kwok.crt'}",
                f"--tls-private-key-file={pki / 'kwok.key'}",
                "--node-lease-duration-seconds=40",
                f"--enable-crds={','.join(KWOK_RUNTIME_CRDS)}",
                *[f"--config={s}" for s in stages],
            ],
            env={"HOME": str(kwok_home)},
        )
        self._create_nodes()
        self._wait("kwok", self._nodes_schedulable, what="fake GPU nodes Ready and untainted")
        self._wait(
            "kube-controller-manager",
            self._default_sa_exists,
            what="ServiceAccount default/default",
        )
        self.timings["full-components"] = time.monotonic() - t

    # ---- helpers -------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        self.logs[name] = log
        e = dict(os.environ)
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            e.pop(k, None)
        e["NO_PROXY"] = e["no_proxy"] = "127.0.0.1,localhost"
        e.update(env or {})
        with open(log, "ab") as f:
            f.write(("$ " + " ".join(argv) + "\n").encode())
            f.flush()
            pop = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=e,
                cwd=self.workdir,
                preexec_fn=_child_setup,
            )
        self._procs.append(_Proc(name, pop, log))
        self.pids[name] = pop.pid

    def _proc(self, name: str) -> _Proc:
        for p in self._procs:
            if p.name == name:
                return p
        raise KeyError(name)

    def _check_alive(self) -> None:
        for p in self._procs:
            rc = p.popen.poll()
            if rc is not None:
                raise ControlPlaneError(f"{p.name} exited with code {rc} during start; last lines of {p.log}:\n{_tail(p.log)}")

    def _wait(self, name: str, ready, what: str | None = None, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ready():
                    return
            except ControlPlaneError:
                raise
            except Exception as e:  # not up yet
                last_err = e
            time.sleep(0.25)
        log = self.logs.get(name)
        raise ControlPlaneError(
            f"timed out after {timeout or self.start_timeout:.0f}s waiting for "
            f"{what or name} (last error: {last_err!r}); last lines of {log}:\n"
            f"{_tail(log) if log else ''}"
        )

    @staticmethod
    def _http_ok(url: str, needle: bytes) -> bool:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200 and needle in r.read()

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the test CA and presenting the admin client cert."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        pki = self.workdir / "pki"
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=3, context=self.ssl_context()) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False

    def _write_kubeconfigs(self, pki: Path) -> None:
        self.kubeconfig.write_text(
            _kubeconfig_yaml(
                self.server,
                pki / "ca.crt",
                {
                    "client-certificate": str(pki / "admin.crt"),
                    "client-key": str(pki / "admin.key"),
                },
            )
        )
        os.chmod(self.kubeconfig, 0o600)

    # ---- Kubernetes API helpers -------------------------------------------------------------
    def api_client(self, token: str | None = None):
        """A kubernetes.client.ApiClient: admin (client cert) or, with ``token``, bearer auth."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        if token is None:
            pki = self.workdir / "pki"
            cfg.cert_file = str(pki / "admin.crt")
            cfg.key_file = str(pki / "admin.key")
        else:
            cfg.api_key = {"authorization": token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(cfg)

    def create_token(self, namespace: str, service_account: str, expiration_seconds: int = 3600) -> str:
        """TokenRequest for an existing ServiceAccount (like ``kubectl create token``)."""
        from kubernetes import client

        with self.api_client() as api:
            tr = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
            )
            out = client.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, tr)
            return out.status.token

    def write_token_kubeconfig(self, token: str, path: str | os.PathLike[str]) -> Path:
        """A kubeconfig that authenticates with ``token`` (e.g. to run kopf as the operator SA)."""
        p = Path(path)
        p.write_text(_kubeconfig_yaml(self.server, self.ca_file, {"token": token}))
        os.chmod(p, 0o600)
        return p

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at the admin kubeconfig."""
        e = dict(os.environ)
        e["KUBECONFIG"] = str(self.kubeconfig)
        e["NO_PROXY"] = e["no_proxy"] = "127.0.0.1,localhost"
        return e

    def _node_body(self, i: int) -> dict[str, Any]:
        name = f"gpu-node-{i}"
        res = {
            "cpu": self.node_cpu,
            "memory": self.node_memory,
            "pods": "110",
            "ephemeral-storage": "1Ti",
            GPU_RESOURCE: str(self.gpus_per_node),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {
                    FAKE_NODE_ANNOTATION[0]: FAKE_NODE_ANNOTATION[1],
                    "node.alpha.kubernetes.io/ttl": "0",
                },
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": self.gpu_product,
                    "nvidia.com/gpu.count": str(self.gpus_per_node),
                    "nvidia.com/gpu.memory": "81559",
                },
            },
            "spec": {},
            "status": {"capacity": res, "allocatable": res},
        }

    def _install_kwok_crds(self, src: Path) -> None:
        """kwok's Logs/ClusterLogs CRDs, so tests can serve `kubectl logs` for fake pods from files."""
        import yaml
        from kubernetes import client

        with self.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for rel in KWOK_CRD_FILES:
                crd = yaml.safe_load((src / rel).read_text())
                ext.create_custom_resource_definition(crd)
            for rel in KWOK_CRD_FILES:
                name = yaml.safe_load((src / rel).read_text())["metadata"]["name"]

                def established(name: str = name) -> bool:
                    c = ext.read_custom_resource_definition(name)
                    return any(x.type == "Established" and x.status == "True" for x in (c.status.conditions or []))

                deadline = time.monotonic() + 30
                while not established():
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"kwok CRD {name} not Established")
                    time.sleep(0.1)

    def serve_pod_logs(
        self,
        namespace: str,
        log_file: str | os.PathLike[str],
        *,
        containers: list[str] | None = None,
        follow: bool = False,
        name: str | None = None,
    ) -> str:
        """Make `kubectl logs` of every pod in `namespace` return `log_file` (CRI log format:
        `<RFC3339Nano> stdout F <line>`), through kwok's ClusterLogs. Returns the object's name."""
        from kubernetes import client

        name = name or f"logs-{namespace}"
        log: dict[str, Any] = {"logsFile": str(Path(log_file).resolve()), "follow": follow}
        if containers:
            log["containers"] = containers
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": {"name": name},
            "spec": {"selector": {"matchNamespaces": [namespace]}, "logs": [log]},
        }
        with self.api_client() as api:
            client.CustomObjectsApi(api).create_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "clusterlogs", body)
        return name

    def _create_nodes(self) -> None:
        from kubernetes import client

        with self.api_client() as api:
            v1 = client.CoreV1Api(api)
            for i in range(self.gpu_nodes):
                body = self._node_body(i)
                v1.create_node(body)
                self.node_names.append(body["metadata"]["name"])

    def _nodes_schedulable(self) -> bool:
        from kubernetes import client

        with self.api_client() as api:
            nodes = client.CoreV1Api(api).list_node().items
        ready = 0
        for n in nodes:
            if n.metadata.name not in self.node_names:
                continue
            conds = {c.type: c.status for c in (n.status.conditions or [])}
            taints = [t.key for t in (n.spec.taints or [])]
            gpus = (n.status.allocatable or {}).get(GPU_RESOURCE)
            if conds.get("Ready") == "True" and not taints and gpus == str(self.gpus_per_node):
                ready += 1
        return ready == len(self.node_names)

    def _default_sa_exists(self) -> bool:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        with self.api_client() as api:
            try:
                client.CoreV1Api(api).read_namespaced_service_account("default", "default")
                return True
            except ApiException as e:
                if e.status == 404:
                    return False
                raise

    # ---- introspection -----------------------------------------------------------------
    def alive(self) -> dict[str, bool]:
        return {p.name: p.popen.poll() is None for p in self._procs}

    def log_tail(self, component: str, lines: int = 40) -> str:
        return _tail(self.logs[component], lines)

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("started" if self._started else "new")
        return f"<ControlPlane tier={self.tier} server={self.server or '-'} {state}>"


# --------------------------------------------------------------------------------------------
# command line: time a start/stop cycle (`python tests/cluster/controlplane.py --tier full -n 3`)
# --------------------------------------------------------------------------------------------
def _main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Start and stop the test control plane, printing timings.")
    ap.add_argument("--tier", choices=TIERS, default="core")
    ap.add_argument("-n", "--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    bins = ensure_built(args.tier, quiet=True)
    for i in range(args.repeat):
        t0 = time.monotonic()
        cp = ControlPlane(tier=args.tier, binaries=bins)
        try:
            cp.start()
            ready = time.monotonic() - t0
            parts = " ".join(f"{k}={v:.2f}s" for k, v in cp.timings.items() if k != "total")
            print(f"run {i + 1}: tier={args.tier} ready in {ready:.2f}s ({parts})", flush=True)
        finally:
            t1 = time.monotonic()
            cp.stop()
        print(f"run {i + 1}: stopped in {time.monotonic() - t1:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
