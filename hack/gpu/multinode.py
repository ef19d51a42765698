#!/usr/bin/env python3
"""Multi-node on real vLLM: the leader and worker that render/lws.py produces, as two processes on one host.

Issue 25 item 5. The GDNModelServer is tests/gpu/harness.adapted_manifest (the trained tiny model, MTP k=2)
with ``tensorParallelSize: 2`` and ``nodes: 2`` — one GPU per "node", the TP group spanning both, the
only split a two-node server of this model has (``pipelineParallelSize`` stays 1: the renderer emits the
sizes the spec sets, and TP=2 is the sharding already proven exact at TP=2 on one node, so a failure here is
multi-node plumbing, not a new sharding). ``gdnctl render`` (the operator's CLI) gives the LeaderWorkerSet;
the leader's and the worker's container args and env are taken from its templates as rendered, then the
kubelet's part is done here: ``$(VAR)`` references in args are expanded from the container env plus what the
LWS pod webhook injects (``LWS_LEADER_ADDRESS=127.0.0.1``, ``LWS_WORKER_INDEX``, ``LWS_GROUP_SIZE``).

Substituted (each listed in the result under ``substitutions``): the leader's ``--host``/``--port``
(harness.launch_argv: 127.0.0.1 and a free port instead of the pod's 0.0.0.0:8000); ``HF_HOME`` (the pod's
/cache volume does not exist here); ``CUDA_VISIBLE_DEVICES`` (the device plugin's part: each "node" sees
only its own GPU, as a one-GPU pod does — vLLM 0.22.0 decides "same node" from the local device count, so
with both GPUs visible the leader waited for a local reader that never came: AssertionError at
multiproc_executor.py:218, first GPU run). What makes two processes of one host look like two nodes: the
worker runs in its own IPC and mount namespace with a private /dev/shm (``unshare``; vLLM's shared-memory
same-node test then fails, as across hosts), and each side has its own ``NCCL_HOSTID`` with
``NCCL_SOCKET_IFNAME=lo`` (NCCL takes them for two hosts and talks over sockets). The model path comes from the manifest (``file://`` the checkout's model), not from an edit.
``--nnodes/--node-rank/--master-addr/--master-port/--headless`` stay as rendered.

Steps, all inside ``--until`` (epoch seconds): start both, wait for the leader's /health and model list;
held-out recall requests (exact answers, checked token by token); acceptance from the leader's /metrics
with the operator's own math (watch/acceptance.py), the operator's stall detector polling the leader all
along (must not flag a healthy group); then SIGKILL the worker's process group (a node lost), send a few
requests to the leader (capped waits) and watch whether and when the leader's engine dies, what /health
says, and whether the stall detector flags the group. Finally both logs are classified with the crash
watch's code (termination-message tail and streamed log, best_result; a death without a recognisable log is
``engine-dead`` as in handlers/crashwatch.handle_death) and the two deaths are grouped with
watch/groups.same_incident, as the operator counts a LeaderWorkerSet group's incident.

Writes ``multinode.json``, ``multinode-leader.log``, ``multinode-worker.log``,
``multinode-leader.metrics.jsonl`` to ``--out``.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0:operator python3 hack/gpu/multinode.py --out .gpu-artifacts
    python3 hack/gpu/multinode.py --dry-run      # render and print both launch lines (no GPU, no vLLM)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import harness  # noqa: E402

NODES = 2
LEADER_ADDRESS = "127.0.0.1"
GROUP_LABELS = {"leaderworkerset.sigs.k8s.io/name": "tiny-recall", "leaderworkerset.sigs.k8s.io/group-index": "0"}
TERMINATION_TAIL_BYTES = 2048  # what the kubelet keeps of the log (FallbackToLogsOnError)
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


def manifest(eager: bool = True) -> dict:
    m = harness.adapted_manifest(
        mtp=True, tensor_parallel_size=NODES, gpu_memory_utilization=0.12, kv_cache_memory="2G", eager=eager
    )
    m["spec"]["nodes"] = NODES
    return m


def render_lws(m: dict) -> tuple[dict, list[str]]:
    items, notes = harness.render_objects(m)
    return next(o for o in items if o["kind"] == "LeaderWorkerSet"), notes


def kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion in container args: defined variables are replaced, `$$` is `$`,
    undefined references stay as written."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def pod_launch(lws: dict, role: str, index: int) -> dict[str, Any]:
    """Container command/args/env of the leader (index 0) or a worker, as the kubelet would start them."""
    tpl = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate" if role == "leader" else "workerTemplate"]
    c = tpl["spec"]["containers"][0]
    if c["command"] != ["vllm", "serve"]:
        raise RuntimeError(f"{role}: rendered command {c['command']}, expected ['vllm', 'serve']")
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    skipped_env = [e["name"] for e in c.get("env", []) if "value" not in e]
    injected = {
        "LWS_LEADER_ADDRESS": LEADER_ADDRESS,
        "LWS_WORKER_INDEX": str(index),
        "LWS_GROUP_SIZE": str(lws["spec"]["leaderWorkerTemplate"]["size"]),
    }
    full_env = {**injected, **env}
    return {
        "rendered_args": list(c["args"]),
        "args": [kubelet_expand(a, full_env) for a in c["args"]],
        "env": full_env,
        "env_not_literal": skipped_env,
        "gpus": c["resources"]["limits"].get("nvidia.com/gpu"),
    }


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def launch_lines(eager: bool = True) -> dict[str, Any]:
    lws, notes = render_lws(manifest(eager))
    leader, worker = pod_launch(lws, "leader", 0), pod_launch(lws, "worker", 1)
    for role, p in (("leader", leader), ("worker", worker)):
        want = {
            "--nnodes": str(NODES),
            "--node-rank": "0" if role == "leader" else "1",
            "--master-addr": LEADER_ADDRESS,
            "--tensor-parallel-size": str(NODES),
        }
        bad = {k: _flag(p["args"], k) for k, v in want.items() if _flag(p["args"], k) != v}
        if bad or (("--headless" in p["args"]) != (role == "worker")) or str(p["gpus"]) != "1":
            raise RuntimeError(f"{role}: the rendered launch line is not a 2-node TP=2 group member: {bad} {p}")
    return {
        "leader": leader,
        "worker": worker,
        "render_notes": notes,
        "lws": {k: lws["spec"]["leaderWorkerTemplate"][k] for k in ("size", "restartPolicy")}
        | {"startupPolicy": lws["spec"].get("startupPolicy")},
    }


def _classify(log_text: str, evidence: Any) -> dict[str, Any]:
    from gdn_operator.watch.result import ClassificationResult, best_result
    from gdn_operator.watch.signatures import classify_termination_message, classify_text

    tail = log_text.encode()[-TERMINATION_TAIL_BYTES:].decode(errors="replace")
    r = best_result(classify_termination_message(tail, evidence=evidence), classify_text(log_text, evidence=evidence))
    if not r.crashed:  # as handlers/crashwatch.handle_death: killed without a recognisable log is still a crash
        r = ClassificationResult(
            crashed=True,
            signature="engine-dead",
            title="Engine container terminated",
            kind="generic",
            generic=True,
            root_cause="no recognisable log",
        )
    return {
        "signature": r.signature,
        "upstream": r.upstream,
        "generic": r.generic,
        "kind": r.kind,
        "root_cause": (r.root_cause or "")[:400],
        "summary": r.summary(),
    }


def group_incident(deaths: list[dict[str, Any]]) -> dict[str, Any]:
    """The crash watch's group counting (watch/groups.py) over the deaths in the order they happened:
    the first is a new crash, a later one of another pod of the group within GROUP_INCIDENT_SECONDS is the
    same incident (counted once, keeping the first's signature when its own is generic)."""
    from gdn_operator.watch.groups import GROUP_INCIDENT_SECONDS, group_of, same_incident

    group = group_of(GROUP_LABELS)
    prev: dict[str, Any] = {}
    counted, out = 0, []
    for d in deaths:
        incident = bool(prev) and same_incident(prev, group, d["pod"], 1, d["finished"])
        sig = prev["signature"] if incident and d["classification"]["generic"] else d["classification"]["signature"]
        counted += 0 if incident else 1
        members = (prev.get("incidentPods") or []) + [d["pod"]] if incident else [d["pod"]]
        prev = {
            "time": d["finished"],
            "pod": d["pod"],
            "group": group,
            "generation": 1,
            "signature": sig,
            "incidentPods": members,
        }
        out.append({"pod": d["pod"], "finished": d["finished"], "same_incident": incident, "effective_signature": sig})
    return {"group": group, "window_s": GROUP_INCIDENT_SECONDS, "deaths": out, "crashes_counted": counted}


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


ISOLATE = [
    "unshare",
    "--ipc",
    "--mount",
    "--propagation",
    "private",
    "--",
    "sh",
    "-c",
    'mount -t tmpfs -o size=16g tmpfs /dev/shm && exec "$0" "$@"',
]


def _start(name: str, p: dict, logdir: Path, cvd: str, listen: bool, node: int) -> harness.Engine:
    r = harness.Rendered(list(p["args"]), dict(p["env"]), [])
    env = {"CUDA_VISIBLE_DEVICES": cvd, "NCCL_HOSTID": f"gdn-node-{node}", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    wrap = ISOLATE if node and shutil.which("unshare") else []
    return harness.start(name, r, logdir, extra_env=env, listen=listen, wrap=wrap)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import concurrent.futures

    import metricswatch

    until = args.until or time.time() + 540.0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logdir = out_dir / "mn-logs"
    lines = launch_lines(eager=not args.compiled)
    res: dict[str, Any] = {
        "vllm_version": harness.VLLM_VERSION,
        "nodes": NODES,
        "parallel": "TP=2 across the 2 nodes",
        "launch": lines,
        "substitutions": [
            "leader --host 0.0.0.0 -> 127.0.0.1, --port 8000 -> a free port (harness.launch_argv)",
            "HF_HOME /cache/huggingface -> <out>/mn-logs/hf-home (no pod volume)",
            "CUDA_VISIBLE_DEVICES leader 0 / worker 1 (device plugin's part: one GPU per node)",
            "worker in its own IPC+mount namespace with a private /dev/shm; NCCL_HOSTID per node, "
            "NCCL_SOCKET_IFNAME=GLOO_SOCKET_IFNAME=lo (two processes of one host as two nodes)",
            "LWS_LEADER_ADDRESS=127.0.0.1, LWS_WORKER_INDEX, LWS_GROUP_SIZE (LWS webhook's part)",
        ],
    }
    t0 = time.monotonic()
    leader = _start("leader", lines["leader"], logdir, "0", listen=True, node=0)
    worker = _start("worker", lines["worker"], logdir, "1", listen=False, node=1)
    watch = None
    try:
        try:
            res["leader_ready_s"] = round(harness.wait_ready(leader, max(30.0, until - time.time() - 150)), 1)
        except RuntimeError as e:
            res["error"] = str(e)[-1500:]
            res["worker_alive_at_failure"] = worker.proc.poll() is None
            return res
        watch = metricswatch.Watch(
            "leader", leader.url, args.stall_seconds, args.interval, t_ref=t0, also_seconds=(60.0,)
        ).start()
        # recall load: exact answers and acceptance
        items = harness.heldout(args.requests)
        watch.mark("load_start")
        got, wall = harness.run_requests(
            leader, items, args.concurrency, keep_errors=True, timeout=max(5.0, min(120.0, until - time.time() - 120))
        )
        eos = harness.eos_ids()
        verdicts = [harness.judge(it, g, eos) for it, g in zip(items, got, strict=True)]
        res["recall"] = {
            "requests": len(items),
            "exact": verdicts.count("exact"),
            "short": verdicts.count("short"),
            "wrong": verdicts.count("wrong"),
            "errors": verdicts.count("error"),
            "wall_s": round(wall, 1),
            "tokens_per_s": round(sum(g.get("completion_tokens") or 0 for g in got) / wall, 1),
        }
        res["recall"]["bad_sample"] = [
            {"expected": it["expected"], "got": g.get("text"), "verdict": v}
            for it, g, v in zip(items, got, verdicts, strict=True)
            if v != "exact"
        ][:3]
        res["acceptance"] = acceptance(harness.metrics(leader))
        watch.mark("load_end")
        # a healthy idle group must stay unflagged for a detector window
        quiet_until = time.monotonic() + min(args.healthy_watch, max(0.0, until - time.time() - 200))
        while time.monotonic() < quiet_until:
            time.sleep(1.0)
        res["healthy_phase"] = {"flagged": watch.first_stalled_t is not None, **watch.summary()}
        # the node is lost: the worker's whole process group dies
        kill_t = time.time()
        t_kill = watch.mark("worker_killed")
        os.killpg(worker.proc.pid, 9)
        worker.proc.wait(30)
        res["worker_exit"] = worker.proc.returncode
        cap = max(5.0, until - time.time() - 40)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            futs = [
                ex.submit(harness.run_requests, leader, harness.heldout(2), 2, keep_errors=True, timeout=cap) for _ in range(2)
            ]
            leader_exit_t = None
            while time.time() < until - 35:
                if leader.proc.poll() is not None:
                    leader_exit_t = time.time()
                    break
                time.sleep(1.0)
            after = [r for f in futs if f.done() for r in f.result()[0]]
        res["after_kill"] = {
            "leader_exited": leader_exit_t is not None,
            "leader_exit_s_after_kill": round(leader_exit_t - kill_t, 1) if leader_exit_t else None,
            "leader_exit_code": leader.proc.returncode,
            "watched_s": round(time.time() - kill_t, 1),
            "requests_answered": sum(1 for r in after if "error" not in r),
            "requests_failed_or_pending": 4 - sum(1 for r in after if "error" not in r),
            "health_codes": watch.health_codes(since=t_kill),
            "stall_flagged_s_after_kill": (
                round(watch.first_stalled_t - t_kill, 1)
                if watch.first_stalled_t is not None and watch.first_stalled_t >= t_kill
                else None
            ),
            "stall_flagged_60s_detector_s_after_kill": next(
                (round(t - t_kill, 1) for t in [watch.also_first_stalled_t.get("60")] if t is not None and t >= t_kill), None
            ),
        }
        deaths = [{"pod": "tiny-recall-0-1", "finished": _iso(kill_t), "log": worker.log_text()}]
        if leader_exit_t:
            deaths.append({"pod": "tiny-recall-0", "finished": _iso(leader_exit_t), "log": leader.log_text()})
        ev = evidence()
        for d in deaths:
            d["classification"] = _classify(d.pop("log"), ev)
        res["crash_watch"] = {
            "classifications": {d["pod"]: d["classification"] for d in deaths},
            "leader_log_if_alive": None if leader_exit_t else _classify(leader.log_text(), ev),
            **group_incident(deaths),
        }
        return res
    finally:
        if watch:
            watch.stop()
            watch.write(out_dir / "multinode-leader.metrics.jsonl")
            res["watch"] = watch.summary()
        for e in (leader, worker):
            harness.stop(e, grace=10.0)
        for n, e in (("leader", leader), ("worker", worker)):
            (out_dir / f"multinode-{n}.log").write_text(e.log_text())
        res["wall_s"] = round(time.monotonic() - t0, 1)


def evidence() -> Any:
    """What the operator knows from the spec (handlers/crashwatch.evidence_for), None if it cannot be built."""
    try:
        from gdn_operator.api.load import parse_spec
        from gdn_operator.watch.evidence import Evidence

        return Evidence.from_spec(parse_spec(manifest()["spec"]))
    except Exception:  # noqa: BLE001 - evidence is optional, as in the operator
        return None


def acceptance(body: str) -> dict[str, Any]:
    from gdn_operator.watch.acceptance import parse_exposition, window_since_start

    snap = parse_exposition(body, timestamp=100.0)
    w = window_since_start(snap)
    st = w.stats()
    return {
        "drafts": st.drafts,
        "draft_tokens": st.draft_tokens,
        "accepted": st.accepted,
        "acceptance_rate": st.acceptance_rate,
        "mean_accepted_length": st.mean_accepted_length,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".gpu-artifacts")
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default now + 540)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stall-seconds", type=float, default=120.0, help="the detector's threshold (the operator's default)")
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--healthy-watch", type=float, default=15.0, help="idle seconds watched before the kill")
    ap.add_argument("--compiled", action="store_true", help="leave enforceEager unset (CUDA graphs; cold compile)")
    ap.add_argument("--dry-run", action="store_true", help="render and print both launch lines, start nothing")
    args = ap.parse_args(argv)
    if args.dry_run:
        print(json.dumps(launch_lines(eager=not args.compiled), indent=1))
        return 0
    res = run(args)
    Path(args.out, "multinode.json").write_text(json.dumps(res, indent=1, default=str))
    rc, ak = res.get("recall", {}), res.get("after_kill", {})
    print(
        f"multinode TP=2 x 2 nodes: leader ready {res.get('leader_ready_s')} s; recall {rc.get('exact')}/{rc.get('requests')} exact; "
        f"acceptance {res.get('acceptance', {}).get('acceptance_rate')}; healthy phase flagged: "
        f"{res.get('healthy_phase', {}).get('flagged')}"
    )
    print(
        f"worker killed: leader exited {ak.get('leader_exited')} after {ak.get('leader_exit_s_after_kill')} s "
        f"(watched {ak.get('watched_s')} s); stall flagged {ak.get('stall_flagged_s_after_kill')} s after the kill; "
        f"/health {ak.get('health_codes')}; crashes counted {res.get('crash_watch', {}).get('crashes_counted')}"
    )
    if res.get("error"):
        print("error:", res["error"][-600:])
    return 0 if res.get("recall") else 1


if __name__ == "__main__":
    sys.exit(main())
