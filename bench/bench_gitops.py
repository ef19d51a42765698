#!/usr/bin/env python3
"""Benchmark (issue 23 done-when): a GitOps-managed server through a mitigation and a crash-loop remediation,
then re-applied from "Git" every 30 s for 5 minutes: no write ping-pong, the remediation is not undone.

    .venv/bin/python bench/bench_gitops.py [--interval 30] [--duration 300]

On a real control plane (tests/cluster, tier full: kwok runs the engine pods) with the real operator process:
  1. server-side apply, field manager "git" (standing in for Argo CD / Flux), of a manifest that sets
     asyncScheduling true, prefixCaching true and admissionPolicy mitigate (vllm#43559 is mitigated: an override);
  2. kwok kills the engine container 3 times with the spec-decode-negative-repeat termination message
     (vllm#53962): the crash watch records asyncScheduling=false as a remediation override and renders it;
  3. the "git" manager re-applies the same manifest every --interval seconds for --duration seconds.
A watch on the GDNModelServer counts every resourceVersion change and attributes it to the managedFields entry
(manager, operation, subresource) that changed with it; a watch on the Deployment counts its writes. Printed:
writes by each manager per phase, the re-applies that changed anything, whether the overrides survived, and
whether .spec / metadata.generation ever changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # tests/waiting.py, which operator_harness uses

import kubernetes  # noqa: E402
import urllib3  # noqa: E402
from _stats import machine  # noqa: E402  (bench/ is on sys.path when run as a script)
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from operator_harness import Kube, OperatorProcess, gms, install_crd, wait_for  # noqa: E402
from test_crashwatch_cluster import crash, running_pod, tail  # noqa: E402  (the crash helpers the cluster tests use)

NS, NAME = "gitops", "srv"
CRASH_LOG = "b9-np-repeat-negative.tail.log"  # spec-decode-negative-repeat (vllm#53962)


def git_apply(k: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply by the "git" field manager, as a GitOps controller applies."""
    return k.co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, NAME, manifest, field_manager="git", force=True, _content_type="application/apply-patch+yaml"
    )


def _entries(obj: dict[str, Any]) -> dict[tuple[str, str, str], tuple[str, str]]:
    return {
        (m.get("manager", ""), m.get("operation", ""), m.get("subresource", "")): (
            m.get("time", ""),
            json.dumps(m.get("fieldsV1"), sort_keys=True),
        )
        for m in obj["metadata"].get("managedFields") or []
    }


class Recorder:
    """Watches one object's resourceVersion changes; attributes each to the managedFields entry that changed."""

    def __init__(self, list_fn: Any, *args: Any, attribute: bool = True) -> None:
        self.list_fn, self.args, self.attribute = list_fn, args, attribute
        self.phase = "setup"
        self.writes: Counter[tuple[str, str]] = Counter()  # (phase, writer)
        self.specs: set[str] = set()
        self.generations: set[int] = set()
        self.last: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rv = None
        while not self.stop.is_set():
            w = kubernetes.watch.Watch()
            kw: dict[str, Any] = {"field_selector": f"metadata.name={NAME}", "timeout_seconds": 60}
            if rv:
                kw["resource_version"] = rv
            try:
                for ev in w.stream(self.list_fn, *self.args, **kw):
                    obj = (
                        ev["object"]
                        if isinstance(ev["object"], dict)
                        else kubernetes.client.ApiClient().sanitize_for_serialization(ev["object"])
                    )
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._record(ev["type"], obj)
                    if self.stop.is_set():
                        break
            except kubernetes.client.exceptions.ApiException as e:
                if e.status == 410:
                    rv = None  # expired: relist (ADDED of the current version is not counted twice, see _record)
                    continue
                if self.stop.is_set():
                    return
                raise
            except urllib3.exceptions.HTTPError:
                if self.stop.is_set():
                    return  # the control plane is going away
                time.sleep(0.5)  # a dropped watch: resume from the last resourceVersion

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        prev, self.last = self.last, obj
        if prev is not None and prev["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]:
            return
        self.specs.add(json.dumps(obj.get("spec"), sort_keys=True))
        self.generations.add(obj["metadata"].get("generation", 0))
        if prev is None:
            self.writes[(self.phase, f"created ({kind})")] += 1
            return
        if not self.attribute:
            self.writes[(self.phase, "any")] += 1
            return
        before, after = _entries(prev), _entries(obj)
        changed = [key for key in after if after[key] != before.get(key)]
        # one write changes its own manager's entry (time and/or fields); a forced apply may also take fields
        # from other entries, which then change too: the newest time is the writer
        if changed:
            writer = "/".join(x for x in max(changed, key=lambda key: after[key][0]) if x)
        else:
            # the same manager wrote the same fields again within managedFields' 1 s time resolution: the writer
            # is the one entry that owns what changed
            part = next((p for p in ("spec", "status") if prev.get(p) != obj.get(p)), "metadata")
            owners = [key for key, (_t, fields) in after.items() if f'"f:{part}"' in fields]
            writer = ("/".join(x for x in owners[0] if x) + " (same second)") if len(owners) == 1 else "(unattributed)"
        self.writes[(self.phase, writer)] += 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between the git manager's re-applies")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of re-applies")
    args = ap.parse_args()
    t_start = time.monotonic()
    bins = ensure_built("full")
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-gitops-"))
    with ControlPlane(work / "cp", tier="full", binaries=bins) as cp:
        api = cp.api_client()
        install_crd(api)
        k = Kube(api)
        k.create_namespace(NS)
        op = OperatorProcess(cp, work / "op", env={"GDN_WATCH_NAMESPACES": NS, "GDN_LOG_LEVEL": "INFO"}).start()
        gms_rec = Recorder(k.co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL)
        dep_rec = Recorder(k.apps.list_namespaced_deployment, NS, attribute=False)
        try:
            gms_rec.thread.start()
            dep_rec.thread.start()
            manifest = gms(
                NAME,
                remediation={"mode": "auto", "threshold": 3},
                asyncScheduling=True,
                prefixCaching=True,
                admissionPolicy="mitigate",
            )
            manifest["metadata"]["namespace"] = NS
            git_apply(k, manifest)
            submitted = k.get(NS, NAME)["spec"]

            def args_of() -> list[str]:
                return k.deployment(NS, NAME).spec.template.spec.containers[0].args

            wait_for(lambda: "--no-enable-prefix-caching" in args_of(), 60, what="the mitigation override rendered")
            pod = running_pod(k, NS, NAME)
            for _ in range(3):
                crash(k, NS, pod.metadata.name, tail(CRASH_LOG))
            wait_for(lambda: "--no-async-scheduling" in args_of(), 60, what="the remediation override rendered")
            wait_for(
                lambda: (
                    k.status(NS, NAME).get("observedGeneration") == 1
                    and len([p for p in k.engine_pods(NS, NAME) if not p.metadata.deletion_timestamp]) == 1
                ),
                90,
                what="the rollout of the remediated engine",
            )
            time.sleep(5)  # let the setup's own status writes land before the resync phase starts counting
            gms_rec.phase = dep_rec.phase = "resync"
            setup_s = time.monotonic() - t_start

            applies = changed = 0
            t0 = time.monotonic()
            for i in range(int(args.duration // args.interval) + 1):  # at 0, interval, ..., duration
                time.sleep(max(0.0, t0 + i * args.interval - time.monotonic()))
                before = k.get(NS, NAME)["metadata"]["resourceVersion"]
                after = git_apply(k, manifest)["metadata"]["resourceVersion"]
                applies += 1
                changed += before != after
            time.sleep(min(args.interval, 10))  # anything the last apply set off has time to show
            resync_s = time.monotonic() - t0

            obj = k.get(NS, NAME)
            overrides = {o["path"]: o for o in (obj.get("status") or {}).get("overrides") or []}
            final_args = args_of()
        finally:
            gms_rec.stop.set()
            dep_rec.stop.set()
            op.stop()

    print(
        f"setup (apply, mitigation, 3 crashes, remediation, rollout): {setup_s:.0f} s; then the git manager "
        f"re-applied the manifest {applies} times, every {args.interval:g} s for {resync_s:.0f} s"
    )
    for label, rec in (("GDNModelServer", gms_rec), ("Deployment", dep_rec)):
        for phase in ("setup", "resync"):
            rows = sorted(((w, n) for (p, w), n in rec.writes.items() if p == phase), key=lambda x: -x[1])
            total = sum(n for _, n in rows)
            print(f"{label} writes during {phase}: {total}" + "".join(f"\n    {n:4d}  {w}" for w, n in rows))
    print(f"git re-applies that changed the object (resourceVersion moved): {changed} of {applies}")
    rem = overrides.get("asyncScheduling") or {}
    mit = overrides.get("prefixCaching") or {}
    print(
        f"remediation override survived: {rem.get('value') is False and rem.get('source') == 'remediation'} "
        f"(asyncScheduling={rem.get('value')!r}, reason {rem.get('reason')}); Deployment renders it: "
        f"{'--no-async-scheduling' in final_args}"
    )
    print(
        f"mitigation override in force: {mit.get('value') is False} (prefixCaching, reason {mit.get('reason')}); "
        f"Deployment renders it: {'--no-enable-prefix-caching' in final_args}"
    )
    print(
        f".spec unchanged throughout: {gms_rec.specs == {json.dumps(submitted, sort_keys=True)}} "
        f"({len(gms_rec.specs)} distinct spec(s) seen); metadata.generation seen: {sorted(gms_rec.generations)}"
    )
    owners = sorted({"/".join(x for x in key if x) for key in _entries(obj)})
    print(f"managedFields owners at the end: {', '.join(owners)}")
    print(machine())
    ok = (
        changed == 0
        and rem.get("value") is False
        and gms_rec.generations == {1}
        and len(gms_rec.specs) == 1
        and not any(p == "resync" and "git" in w for (p, w) in gms_rec.writes)
    )
    print(
        f"verdict: {'PASS' if ok else 'FAIL'} (no git write after the first apply, override kept, spec and generation unchanged)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
