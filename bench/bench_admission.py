#!/usr/bin/env python3
"""Benchmark: admission at a paced create rate, measured where the API server measures its webhooks.

    nice -n 10 .venv/bin/python bench/bench_admission.py [--rate 100] [--seconds 15] [--corpus fuzz|valid]
    nice -n 10 .venv/bin/python bench/bench_admission.py --compare-tree DIR [--rounds 2]

Starts a real control plane (tests/cluster, core tier), runs the operator with its admission webhooks (watching the
namespace the creates go to, so its reconciles of what is admitted compete with admission, as in a cluster), and
POSTs GDNModelServers at a paced rate (open loop: the i-th request is due at i/rate seconds whatever the answers
before it; `--workers` threads send them). The manifests are bench_fuzz.py's corpus (tests/fuzz_corpus.py: hostile
input, most of it refused) or, with `--corpus valid`, admitted servers over the catalogued releases. The figures:

  the API server's own histogram apiserver_admission_webhook_admission_duration_seconds (its /metrics, read before
  and after; per webhook type: admit = mutating, validating), p50/p99 interpolated in its buckets as Prometheus'
  histogram_quantile does, and the share of calls at or under 100 ms (the goal: p99 under 100 ms, i.e. >= 99 %);
  the answers: 201, 4xx, 5xx (5xx must be 0); the webhook call errors the API server counts
  (apiserver_admission_webhook_rejection_count by error_type: calling_webhook_error = a timeout or failed call);
  the client's request latency and how late the pacer ran;
  the cores the operator's process used during the round (its Python threads share one GIL: near 1 core its
  webhook waits behind its reconciles however little the webhook itself costs).

With --floor, each round also runs the floor: the same operator without its webhooks (so its reconciles of what is
admitted compete exactly as before) and, in its place, a do-nothing webhook in its own process (aiohttp over TLS, as
kopf's server is: it parses each AdmissionReview and allows it) registered with the same rules, timeout and failure
policy as ours. Its p99 is what any Python webhook gets on this machine under this load; ours minus it is what our
admission code costs. (Its answers are all 201, as nothing is refused; the fuzz corpus's refused creates then cost
the API server more.)

With --compare-tree DIR (another commit's tree, exported outside the repo: `git archive main | tar -x -C DIR`) the
same paced load goes to this tree's operator and to one run with PYTHONPATH=DIR/operator, one operator at a time on
the same control plane, each in its own namespace with the CRD its own models generate, the order alternating over
--rounds rounds: the baseline in the same run. The flood without pacing stays bench_fuzz.py (its 5xx row).
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))

import kubernetes  # noqa: E402
from _stats import child_pids, cpu_seconds, machine, pct  # noqa: E402  (bench/ is on sys.path when run as a script)
from aiohttp import web  # noqa: E402
from bench_fuzz import manifest, post, start_webhook_operator, tree_crd  # noqa: E402
from controlplane import ControlPlane, ensure_built, free_port  # noqa: E402
from gdn_operator.handlers.webhook.certs import new_bundle  # noqa: E402
from gdn_operator.rules import load_rules  # noqa: E402
from operator_harness import WEBHOOK_CONFIG, OperatorProcess, delete_webhook_configs, gms, install_crd, wait_for  # noqa: E402

HIST = "apiserver_admission_webhook_admission_duration_seconds"
REJECTIONS = "apiserver_admission_webhook_rejection_count"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(api: Any) -> str:
    """The API server's /metrics (admin client)."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", header_params={"Accept": "text/plain"})
    resp = api.rest_client.pool_manager.request(method, url, headers=headers, timeout=60)
    return resp.data.decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of metric `name` (labels sorted) -> value."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out[tuple(sorted(_LABEL.findall(m.group(2))))] = float(m.group(3))
    return out


def webhook_buckets(before: str, after: str, webhook_prefix: str) -> dict[str, dict[float, float]]:
    """Per webhook type (admit, validating): le -> calls at or under it, counted between the two scrapes, for the
    webhooks whose name starts with `webhook_prefix` (the operator's)."""
    b0, b1 = samples(before, HIST + "_bucket"), samples(after, HIST + "_bucket")
    out: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, v in b1.items():
        d = dict(labels)
        if not d.get("name", "").startswith(webhook_prefix) or d.get("operation") != "CREATE":
            continue
        le = float("inf") if d["le"] == "+Inf" else float(d["le"])
        out[d["type"]][le] += v - b0.get(labels, 0.0)
    return {k: dict(v) for k, v in out.items()}


def quantile(buckets: dict[float, float], q: float) -> float:
    """histogram_quantile(q) over cumulative buckets (linear inside a bucket; the highest finite bound past it)."""
    les = sorted(buckets)
    total = buckets[les[-1]] if les else 0.0
    if total <= 0:
        return float("nan")
    rank, prev_le, prev_n = q * total, 0.0, 0.0
    for le in les:
        n = buckets[le]
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / (n - prev_n) if n > prev_n else 1.0)
        prev_le, prev_n = le, n
    return prev_le


def rejections(before: str, after: str, webhook_prefix: str) -> dict[str, float]:
    """Webhook rejections the API server counted between the scrapes, by error_type (no_error: the webhook said no)."""
    r0, r1 = samples(before, REJECTIONS), samples(after, REJECTIONS)
    out: dict[str, float] = defaultdict(float)
    for labels, v in r1.items():
        d = dict(labels)
        if d.get("name", "").startswith(webhook_prefix) and v - r0.get(labels, 0.0):
            out[d.get("error_type", "?")] += v - r0.get(labels, 0.0)
    return dict(out)


def valid_manifests(n: int, seed: int) -> list[str]:
    """Servers the webhook admits (MTP on, unset fields defaulted) over the catalogued releases."""
    rng, releases = random.Random(seed), list(load_rules().releases)
    out = []
    for i in range(n):
        v = rng.choice(releases)
        spec: dict[str, Any] = {"image": {"tag": f"v{v}", "vllmVersion": v}, "tensorParallelSize": rng.choice([1, 2, 4])}
        out.append(json.dumps(gms(f"paced-{i}", **spec)))
    return out


def corpus(kind: str, n: int, seed: int) -> list[str]:
    if kind == "valid":
        return valid_manifests(n, seed)
    rng, used = random.Random(seed), set()
    return [manifest(rng, i, used)[1] for i in range(n)]


def paced(api: Any, ns: str, texts: list[str], rate: float, workers: int) -> dict[str, Any]:
    """POST `texts` into `ns`, the i-th due at i/rate s; answers, client latencies and the pacer's lateness."""
    codes: dict[str, int] = defaultdict(int)
    lat: list[float] = []
    lock = threading.Lock()

    def one(text: str) -> None:
        status, _body, dt = post(api, ns, text)
        with lock:
            lat.append(dt)
            codes["201" if status == 201 else "5xx" if status >= 500 else "4xx"] += 1

    late = 0.0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        t0 = time.perf_counter()
        for i, text in enumerate(texts):
            due = t0 + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            pool.submit(one, text)
    took = time.perf_counter() - t0
    return {"codes": dict(codes), "lat": lat, "late": late, "took": took}


def pooled_client(cp: ControlPlane, workers: int) -> Any:
    cfg = cp.api_client().configuration
    cfg.connection_pool_maxsize = workers
    return kubernetes.client.ApiClient(cfg)


def report(label: str, res: dict[str, Any], buckets: dict[str, dict[float, float]], rej: dict[str, float]) -> bool:
    n = len(res["lat"])
    print(
        f"  {label}: {n} creates in {res['took']:.1f} s ({n / res['took']:.0f}/s; pacer at most {res['late'] * 1000:.0f} ms "
        f"late); answers {res['codes']}; client latency p50 {pct(res['lat'], 50) * 1000:.1f} ms, "
        f"p99 {pct(res['lat'], 99) * 1000:.1f} ms; the operator process used {res['op_cores']:.2f} cores (its "
        "Python threads share one GIL: near 1 it is saturated)"
        + (f", its webhook front {res['front_cores']:.2f}" if res.get("front_cores") is not None else ", no webhook front")
    )
    ok = res["codes"].get("5xx", 0) == 0
    for typ in sorted(buckets):
        b = buckets[typ]
        total = b.get(float("inf"), 0.0)
        under = b.get(0.1, 0.0) / total if total else float("nan")
        ok = ok and under >= 0.99
        shares = "  ".join(f"<={le * 1000:g} ms {b[le] / total * 100:.1f} %" for le in sorted(b) if le <= 1.0 and total)
        print(
            f"    API server histogram, {typ:<10} calls {total:6.0f}  p50 {quantile(b, 0.5) * 1000:6.1f} ms  "
            f"p99 {quantile(b, 0.99) * 1000:6.1f} ms  at or under 100 ms: {under * 100:.2f} %\n"
            f"      (its buckets are coarse, the quantiles interpolated inside them; calls per bucket: {shares})"
        )
    print(f"    webhook rejections by error_type (calling_webhook_error = timeout or failed call): {rej or 'none'}")
    return ok


FLOOR_CONFIG = "gdn-admission-floor"


def serve_noop(port: int, certdir: str) -> None:
    """The floor's webhook (run as `--serve-noop PORT CERTDIR`): every AdmissionReview parsed and allowed."""

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        uid = body["request"]["uid"]
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}
        )

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(Path(certdir) / "tls.crt"), str(Path(certdir) / "tls.key"))
    app = web.Application(client_max_size=64 << 20)  # the fuzz corpus has bodies past aiohttp's 1 MiB default
    app.router.add_post("/{tail:.*}", review)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, print=None, access_log=None)


class Floor:
    """The do-nothing webhook for one round: its process and its ValidatingWebhookConfiguration, made from the
    operator's own (`template`: its webhooks as the API server holds them) with only the name and target changed."""

    def __init__(self, admin: Any, workdir: Path, template: list[dict[str, Any]]):
        self.admin, self.port = admin, free_port()
        bundle = new_bundle(["127.0.0.1"])
        bundle.write(workdir)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-noop", str(self.port), str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        hooks = []
        for h in template:
            h = json.loads(json.dumps(h))
            h["name"] = "floor." + h["name"]
            h["clientConfig"] = {
                "url": f"https://127.0.0.1:{self.port}/validate",
                "caBundle": base64.b64encode(bundle.ca_pem).decode(),
            }
            hooks.append(h)
        adm = kubernetes.client.AdmissionregistrationV1Api(admin)
        adm.create_validating_webhook_configuration({"metadata": {"name": FLOOR_CONFIG}, "webhooks": hooks})

    def stop(self) -> None:
        delete_webhook_configs(self.admin, FLOOR_CONFIG)
        self.proc.terminate()
        self.proc.wait(10)


def template_of(admin: Any) -> list[dict[str, Any]]:
    """The operator's validating webhooks as the API server holds them (camelCase, read-only fields dropped)."""
    cfg = kubernetes.client.AdmissionregistrationV1Api(admin).read_validating_webhook_configuration(WEBHOOK_CONFIG)
    return [admin.sanitize_for_serialization(h) for h in cfg.webhooks]


def start_floor_operator(cp: ControlPlane, admin: Any, api: Any, workdir: Path, ns: str, template: list[dict[str, Any]]):
    """The operator without its webhooks (reconciling `ns`) and the floor's webhook, warmed up as
    bench_fuzz.start_webhook_operator warms ours."""
    op = OperatorProcess(
        cp, workdir, env={"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0", "GDN_WATCH_NAMESPACES": ns}
    ).start()
    floor = Floor(admin, workdir / "floor-tls", template)
    for j in range(20):
        warm = json.dumps(gms(f"warm-{j}", image={"tag": "v0.32.0", "vllmVersion": "0.32.0"}))
        wait_for(lambda text=warm: post(api, ns, text)[0] == 201, 60, interval=0.5, what="floor webhook answering")
    return op, floor


def run(args: argparse.Namespace) -> int:
    n = int(args.rate * args.seconds)
    texts = corpus(args.corpus, n * args.rounds, args.seed)
    chunks = [texts[r :: args.rounds] for r in range(args.rounds)]
    trees: list[tuple[str, str | None]] = [("this", None)]
    if args.compare_tree:
        other = Path(args.compare_tree).resolve()
        if not (other / "operator" / "gdn_operator").is_dir():
            raise SystemExit(f"--compare-tree {other}: no operator/gdn_operator there")
        trees.append(("baseline", str(other / "operator")))
    if args.floor:
        trees.append(("floor", None))  # this tree's operator, a do-nothing webhook in place of its own
    crds = {label: tree_crd(pythonpath) for label, pythonpath in trees}
    results: dict[str, list[tuple[dict[str, Any], dict[str, dict[float, float]], dict[str, float]]]] = defaultdict(list)
    template: list[dict[str, Any]] = []  # the operator's validating webhooks, for the floor's (read in a "this" round)
    work = Path(tempfile.mkdtemp(prefix="gdn-admission-"))
    with ControlPlane(work / "cp", tier="core", binaries=ensure_built("core")) as cp:
        admin = cp.api_client()
        install_crd(admin)
        api = pooled_client(cp, args.workers)
        core = kubernetes.client.CoreV1Api(admin)
        for r, chunk in enumerate(chunks):
            order = trees if r % 2 == 0 else trees[::-1]
            if args.floor and not template:  # the floor copies the configuration of a "this" round before it
                order = sorted(order, key=lambda t: t[0] == "floor")
            for label, pythonpath in order:
                ns = f"paced-{label}-{r}"
                core.create_namespace({"metadata": {"name": ns}})
                install_crd(admin, crds[label])  # its own schema: the API server's defaults match its model
                time.sleep(3)  # the new schema reaches the API server's handlers (the warm-up then checks)
                watched = f"{ns}-warm" if args.no_reconcile else ns  # the webhooks serve every namespace
                if watched != ns:
                    core.create_namespace({"metadata": {"name": watched}})  # the warm-up's servers only
                floor = None
                if label == "floor":
                    op, floor = start_floor_operator(cp, admin, api, work / f"op-{label}-{r}", watched, template)
                else:
                    op = start_webhook_operator(cp, admin, work / f"op-{label}-{r}", pythonpath, watched)
                    if label == "this" and not template:
                        template = template_of(admin)
                spy = None
                if args.py_spy and label == "this" and r == 0 and op.proc is not None:
                    spy = subprocess.Popen(
                        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--rate", "200",
                         "--nonblocking", "--idle", "--pid", str(op.proc.pid), "-o", args.py_spy],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                try:
                    before = scrape(admin)
                    cpu0 = cpu_seconds(op.proc.pid) if op.proc is not None else 0.0
                    fronts = child_pids(op.proc.pid) if op.proc is not None else []  # the webhook front, when it runs
                    front0 = sum(cpu_seconds(p) for p in fronts)
                    res = paced(api, ns, chunk, args.rate, args.workers)
                    # the operator's process: its Python threads share one GIL, so near 1 core it is saturated
                    res["op_cores"] = (cpu_seconds(op.proc.pid) - cpu0) / res["took"] if op.proc is not None else 0.0
                    res["front_cores"] = (sum(cpu_seconds(p) for p in fronts) - front0) / res["took"] if fronts else None
                    after = scrape(admin)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                        spy.wait(60)
                    if op.proc is None or op.proc.poll() is not None:
                        raise SystemExit(f"the {label} operator exited during its round")
                finally:
                    op.stop()
                    if floor is not None:
                        floor.stop()
                    delete_webhook_configs(admin)  # the next operator registers its own
                results[label].append((res, webhook_buckets(before, after, ""), rejections(before, after, "")))
    print(
        f"paced admission: {args.rate:.0f} creates/s for {args.seconds:.0f} s per round, {args.rounds} round(s), corpus "
        f"{args.corpus} (seed {args.seed}), {args.workers} sender threads; control plane: core tier, the operator "
        f"({'webhooks only' if args.no_reconcile else 'webhooks + its reconciles of what is admitted'}) alone on it"
    )
    verdict = True
    for label, _ in trees:
        for r, (res, buckets, rej) in enumerate(results[label]):
            ok = report(f"{label} round {r + 1}", res, buckets, rej)
            verdict = verdict and (ok or label != "this")  # the target is this tree's
    if args.floor:
        print("  this / floor, per round (validating p99 and share at or under 100 ms; the floor is the same run's):")
        for r, ((_, b_this, _), (_, b_floor, _)) in enumerate(zip(results["this"], results["floor"], strict=True)):
            t, f = b_this.get("validating", {}), b_floor.get("validating", {})
            if t and f:
                share = lambda b: b.get(0.1, 0.0) / b[float("inf")] * 100  # noqa: E731
                print(
                    f"    round {r + 1}: p99 {quantile(t, 0.99) * 1000:.0f} ms vs {quantile(f, 0.99) * 1000:.0f} ms "
                    f"({quantile(t, 0.99) / quantile(f, 0.99):.2f}x); {share(t):.1f} % vs {share(f):.1f} % at or under 100 ms"
                )
    print(machine())
    print(f"target: webhook p99 under 100 ms at the API server's histogram, no 5xx: {'PASS' if verdict else 'FAIL'}")
    return 0 if verdict else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=100.0, help="creates per second")
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds of paced creates per round and tree")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=32, help="sender threads (an open loop needs more than rate x p99)")
    ap.add_argument(
        "--no-reconcile", action="store_true", help="the operator watches another namespace: admission alone, no reconciles"
    )
    ap.add_argument("--corpus", choices=("fuzz", "valid"), default="fuzz")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--py-spy", metavar="FILE", help="record this tree's operator in round 1 (py-spy raw; bench/pyspy_top.py reads it)"
    )
    ap.add_argument("--compare-tree", metavar="DIR", help="also run another commit's operator (an exported tree)")
    ap.add_argument("--floor", action="store_true", help="also run a do-nothing webhook in place of ours (module docstring)")
    ap.add_argument("--serve-noop", nargs=2, metavar=("PORT", "CERTDIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_noop:
        serve_noop(int(a.serve_noop[0]), a.serve_noop[1])
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
