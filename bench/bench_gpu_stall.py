#!/usr/bin/env python3
"""GPU host, two GPUs: the TP=2 stall of MTP + FULL decode CUDA graphs, seen by the operator's own stall detector.

Issue 24 item 5. ``../shared/fixtures/vllm-0.22.0-h100x2-tp2`` showed it: at ``--tensor-parallel-size 2``, MTP
k=2 with FULL decode CUDA graphs (vLLM's default FULL_AND_PIECEWISE) drains a burst of mixed load down to
7-8 requests and then serves them at 0-2 tokens/s for minutes, while ``/health`` answers 200; PIECEWISE
drains in seconds. This benchmark starts both engines at once (``bench_gpu_tp.render``: the rendered argv,
``base-cudagraph`` = vLLM's default graphs, ``base-cg-piecewise`` = what the operator renders at 0.22.0),
drives both with the same seeded mixed load (``bench_gpu_tp.requests``: recall prompts checked, long
prompts near max-model-len, short ones) at ``--concurrency`` for ``--load-seconds``, then sends nothing
more and watches. Every request's wait is capped (``--request-cap`` and the deadline), so a stalled engine
cannot hold the run past its limit.

From the moment each engine is Ready, ``tests/gpu/metricswatch.Watch`` polls its ``/metrics`` and
``/health`` every ``--interval`` s and feeds ``gdn_operator.watch.stall.StallDetector`` (the operator's
code) with the exposition text. It stops when the FULL engine is flagged and the PIECEWISE one has been
idle for ``--stall-seconds`` + 2 intervals (so "never flagged" covers a full detector window), when both
drained, or at the deadline (``--until``, epoch seconds; the engines are stopped 25 s before it).

Writes to ``--out``: ``stall.json`` (per engine: ready time, load figures, exact recall, time from load
start / load end to the first stalled verdict, /health codes while flagged, the log's crash-watch
classification) and ``stall-<config>.metrics.jsonl`` (the series, tests/gpu/metricswatch.py's format),
engine logs under ``tp-logs/``.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0:operator python3 bench/bench_gpu_stall.py --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import bench_gpu_tp as tp  # noqa: E402
import harness  # noqa: E402
import metricswatch  # noqa: E402

FULL, PIECEWISE = "base-cudagraph", "base-cg-piecewise"
TEARDOWN_S = 25.0  # stopping two engines (SIGTERM, then SIGKILL after 10 s) and writing the results


def default_stall_seconds() -> float:
    from gdn_operator.watch import stall

    return float(getattr(stall, "DEFAULT_STALL_SECONDS", 60.0))


class Load:
    """The same seeded request stream into several engines, ``concurrency`` in flight each, capped waits."""

    def __init__(self, engines: dict[str, harness.Engine], concurrency: int, seed: int, cap: float, deadline: float):
        self.engines, self.concurrency, self.cap, self.deadline = engines, concurrency, cap, deadline
        self.eos = harness.eos_ids()
        self.gens = {n: tp.requests(seed) for n in engines}
        self.lock = threading.Lock()
        self.sending = threading.Event()
        self.stats = {
            n: {
                "sent": 0,
                "completed": 0,
                "failed": 0,
                "timed_out": 0,
                "tokens": 0,
                "recall": 0,
                "recall_exact": 0,
                "in_flight": 0,
                "bad_recall_sample": [],
                "failures": [],
            }
            for n in engines
        }

    def _worker(self, name: str) -> None:
        eng, st = self.engines[name], self.stats[name]
        while self.sending.is_set():
            with self.lock:
                it = next(self.gens[name])
                st["sent"] += 1
                st["in_flight"] += 1
            timeout = max(1.0, min(self.cap, self.deadline - time.time()))
            try:
                got = harness.complete(
                    eng, it["prompt_token_ids"], it["max_tokens"], ignore_eos=it.get("ignore_eos", False), timeout=timeout
                )
            except (OSError, ValueError, KeyError) as e:
                with self.lock:
                    st["in_flight"] -= 1
                    timed_out = "timed out" in str(e) or isinstance(e, TimeoutError)
                    st["timed_out" if timed_out else "failed"] += 1
                    if len(st["failures"]) < 4:
                        st["failures"].append(f"{it['id']}: {type(e).__name__}: {str(e)[:160]}")
                if not timed_out:
                    time.sleep(0.5)  # a refused connection must not spin
                continue
            with self.lock:
                st["in_flight"] -= 1
                st["completed"] += 1
                st["tokens"] += got.get("completion_tokens") or 0
                if it["id"].startswith("recall"):
                    st["recall"] += 1
                    verdict = harness.judge(it, got, self.eos)
                    st["recall_exact"] += verdict == "exact"
                    if verdict != "exact" and len(st["bad_recall_sample"]) < 3:
                        st["bad_recall_sample"].append({"verdict": verdict, "expected": it["expected"], "got": got["text"]})

    def start(self) -> None:
        self.sending.set()
        for name in self.engines:
            for _ in range(self.concurrency):
                threading.Thread(target=self._worker, args=(name,), daemon=True).start()

    def stop_sending(self) -> None:
        self.sending.clear()


def _drained(w: metricswatch.Watch) -> bool:
    v = w.last_verdict()
    return bool(v) and not (v.get("running") or 0) and not (v.get("waiting") or 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=f"{FULL},{PIECEWISE}", help="bench_gpu_tp configurations to run side by side")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--request-cap", type=float, default=150.0, help="longest wait for one request (s)")
    ap.add_argument("--stall-seconds", type=float, default=None, help="detector threshold (default: the operator's)")
    ap.add_argument("--also-stall-seconds", default="60", help="comma list: further detectors on the same scrapes")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between /metrics polls")
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default: now + 540)")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--out", default=".gpu-artifacts")
    args = ap.parse_args(argv)
    until = args.until or time.time() + 540.0
    stall_s = args.stall_seconds if args.stall_seconds is not None else default_stall_seconds()
    also = tuple(float(x) for x in args.also_stall_seconds.split(",") if x)
    names = [n for n in args.configs.split(",") if n]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logdir = out_dir / "tp-logs"
    t0 = time.monotonic()
    result: dict = {
        "tp": args.tp,
        "vllm_version": harness.VLLM_VERSION,
        "stall_seconds": stall_s,
        "interval_s": args.interval,
        "load_seconds": args.load_seconds,
        "concurrency": args.concurrency,
        "request_cap_s": args.request_cap,
        "engines": {},
    }
    engines: dict[str, harness.Engine] = {}
    watches: dict[str, metricswatch.Watch] = {}
    try:
        for n in names:
            rendered, env = tp.render(n, args.tp)
            engines[n] = harness.start(n, rendered, logdir, extra_env=env)
            result["engines"][n] = {
                "argv": engines[n].argv,
                "env": {**rendered.env, **env},
                "changed_after_render": [x for x in rendered.notes if x.startswith(("# flipped", "# removed"))],
            }
        # leave room for the load and the quickest detector's window (the series is kept whatever happens)
        startup_limit = until - time.time() - args.load_seconds - min((stall_s, *also)) - 2 * args.interval - TEARDOWN_S
        with concurrent.futures.ThreadPoolExecutor(len(engines)) as ex:
            futs = {n: ex.submit(harness.wait_ready, e, max(30.0, startup_limit)) for n, e in engines.items()}
            for n, f in futs.items():
                try:
                    result["engines"][n]["ready_s"] = round(f.result(), 1)
                    watches[n] = metricswatch.Watch(
                        n, engines[n].url, stall_s, args.interval, t_ref=t0, also_seconds=also
                    ).start()
                except RuntimeError as e:
                    result["engines"][n].update(started=False, error=str(e)[-1500:])
        if not watches:
            raise RuntimeError("no engine became ready")
        live = {n: engines[n] for n in watches}
        load = Load(live, args.concurrency, args.seed, args.request_cap, until - TEARDOWN_S)
        load_start = time.monotonic() - t0
        for w in watches.values():
            w.mark("load_start")
        load.start()
        end_load = time.monotonic() + args.load_seconds
        while time.monotonic() < end_load and time.time() < until - TEARDOWN_S:
            time.sleep(0.5)
        load.stop_sending()
        load_end = time.monotonic() - t0
        for w in watches.values():
            w.mark("load_end")
        quiet_needed = stall_s + 2 * args.interval
        idle_since: dict[str, float | None] = {n: None for n in watches}
        stop_reason = "deadline"
        while time.time() < until - TEARDOWN_S:
            now = time.monotonic() - t0
            for n, w in watches.items():
                idle_since[n] = (idle_since[n] or now) if _drained(w) else None
            quiet = {n: idle_since[n] is not None and now - idle_since[n] >= quiet_needed for n in watches}
            flagged = {n: w.first_stalled_t is not None for n, w in watches.items()}
            if FULL in watches and flagged[FULL] and all(quiet[n] or n == FULL for n in watches):
                stop_reason = "full flagged, others idle for a detector window"
                break
            if all(quiet.values()):
                stop_reason = "all drained and idle for a detector window"
                break
            time.sleep(1.0)
        result["stop_reason"] = stop_reason
        for n, w in watches.items():
            w.mark("end")
            w.stop()
            s = w.summary()
            st = dict(load.stats[n])
            st["exact_recall_rate"] = round(st["recall_exact"] / st["recall"], 4) if st["recall"] else None
            first = s["first_stalled_t"]
            flagged_t = [r for r in w.lines if r.get("verdict", {}).get("stalled")]
            also_first = {k: (round(v - load_start, 1) if v is not None else None) for k, v in s["also_first_stalled_t"].items()}
            result["engines"][n].update(
                started=True,
                load=st,
                watch=s,
                flagged=first is not None,
                also_detect_s_from_load_start=also_first,
                detect_s_from_load_start=round(first - load_start, 1) if first is not None else None,
                detect_s_from_load_end=round(first - load_end, 1) if first is not None else None,
                drained_s_after_load_end=round(idle_since[n] - load_end, 1) if idle_since[n] is not None else None,
                health_while_flagged={
                    str(c): sum(1 for r in flagged_t if r.get("health") == c) for c in {r.get("health") for r in flagged_t}
                },
                running_at_detection=flagged_t[0]["verdict"]["running"] if flagged_t else None,
            )
    finally:
        for e in engines.values():
            harness.stop(e, grace=10.0)
    for n, e in engines.items():
        text = e.log_text()
        result["engines"][n]["classification"] = tp.classify(text)
        result["engines"][n]["shm_broadcast_waits"] = text.count("No available shared memory broadcast block found")
        result["engines"][n]["log"] = str(e.log)
        if n in watches:
            watches[n].write(out_dir / f"stall-{n}.metrics.jsonl")
    result["wall_s"] = round(time.monotonic() - t0, 1)
    (out_dir / "stall.json").write_text(json.dumps(result, indent=1))
    print(
        f"stall detector: {stall_s:.0f} s threshold, {args.interval:.0f} s polls; load {args.load_seconds:.0f} s "
        f"at concurrency {args.concurrency}; stop: {result.get('stop_reason')}"
    )
    print(
        f"{'config':20} {'ready s':>8} {'flagged':>8} {'t_load s':>9} {'t_end s':>8} {'drained':>8} {'done':>5} "
        f"{'t/o':>4} {'recall':>7} health-while-flagged"
    )
    for n, r in result["engines"].items():
        ld = r.get("load", {})
        print(
            f"{n:20} {r.get('ready_s', '-')!s:>8} {r.get('flagged', '-')!s:>8} {r.get('detect_s_from_load_start') or '-'!s:>9} "
            f"{r.get('detect_s_from_load_end') or '-'!s:>8} {r.get('drained_s_after_load_end') or '-'!s:>8} "
            f"{ld.get('completed', '-')!s:>5} {ld.get('timed_out', '-')!s:>4} {ld.get('exact_recall_rate', '-')!s:>7} "
            f"{r.get('health_while_flagged', {})}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
