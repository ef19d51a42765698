"""The chart's monitoring in a REAL monitoring stack (issue 28): the Prometheus Operator (built from the Go
module proxy, tests/cluster/build.sh promop) selects the chart's ServiceMonitor and the operator's
per-server PodMonitors the way kube-prometheus-stack does by default (`release: <its release>` on
ServiceMonitors, PodMonitors and PrometheusRules, any namespace); the real Prometheus server (also from
the Go module proxy, build.sh prometheus) runs the configuration it generated (tests/cluster/monitoring.py: the one change is
`kubeconfig_file` for service discovery) and scrapes

- the operator, run locally with the environment of the chart's Deployment, listening on the IP of the
  kwok pod of that Deployment (so the chart's metrics Service has it as its endpoint; that pod runs on a
  kwok node that gives it a non-loopback address, because the API server keeps 127.x out of EndpointSlices
  — tests/cluster/monitoring.py ServiceHostNode). That address is 10.254.0.2 on `lo` of a private network
  namespace: test_monitoring_live.py runs this module inside one (`unshare -n`, nothing but `lo`), so every
  packet of the test stays in a namespace the test made; never an address of the machine itself), and
- two REAL vLLM CPU engines serving the trained tiny model with MTP k=2 — the healthy one
  (tests/models/tiny-qwen3-next-recall) and the broken-MTP-head variant — each on the IP of its
  GDNModelServer's kwok pod, under traffic, with output probes on,

plus a third, fake engine that kwok crashes (a crash signature the crash watch classifies and remediates),
and one admission denial. Then: every dashboard panel's PromQL (variables substituted) returns series;
the chart's alert rules (from the PrometheusRule the chart rendered, loaded by the Prometheus Operator)
fire for the broken-MTP server, pending then firing, and never for the healthy one; every firing alert
names its server's own namespace and name. The negative control: a second Prometheus with the same rules
sees the monitors as they were before the label fix (the chart's ServiceMonitor without honorLabels, no
engine PodMonitor selected) and fails those label checks.

The chart is rendered with `for:` durations and intervals shortened through its values (as a user would
tune them): acceptanceCollapse.for 30s, scrape/evaluation intervals 5s, operator acceptance window 30s.

Size (~600 lines): one live stack (a module-scoped fixture that takes minutes to bring up) and the five
tests that share it; split, each file would start its own stack.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import recall  # noqa: E402
from _chart_helpers import CHART, VALUE_SETS, docs, helm, tools, value_args  # noqa: E402
from engine_fixtures import own_cores, require_engine_python, start_engine, stop_engine  # noqa: E402
from controlplane import FAKE_NODE_ANNOTATION  # noqa: E402
from monitoring import (  # noqa: E402
    PrometheusOperator,
    PrometheusServer,
    ServiceHostNode,
    find_monitoring,
    generated_config,
    localize,
    prometheus_version,
)
from operator_harness import Kube, OperatorProcess, delete_webhook_configs, gms, install_crd, wait_for  # noqa: E402
from test_crashwatch_cluster import crash, tail  # noqa: E402
from waiting import poll  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.monitoring, pytest.mark.timeout(1500)]

SERVICE_HOST_ENV = "GDN_TEST_SERVICE_HOST_IP"  # set by test_monitoring_live.py (the namespace's one address)
KPS = "kube-prometheus-stack"  # kube-prometheus-stack selects monitors/rules by `release: <its release name>`
PROM = "kps"
PRE_FIX = "pre-fix"  # the negative control's Prometheus and the label on its copy of the pre-fix ServiceMonitor
BROKEN_MODEL = recall.MODEL_DIR.parent / "tiny-qwen3-next-recall-broken-mtp"
ENGINE_PORT = 8000  # render/engine.py ENGINE_PORT: what the Service, the PodMonitor and the probes use
WEBHOOK_CONFIG = "gdn-test-monitoring.serving.gdn-operator.io"
# the operator's env that OperatorProcess sets itself (ports, liveness, webhook in local mode)
OWN_ENV = ("GDN_METRICS_PORT", "GDN_LIVENESS", "GDN_LOG_LEVEL", "GDN_WEBHOOK_", "GDN_PEERING")
GRAFANA = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "10m"}


class Traffic:
    """Held-out prompts (token ids, greedy) sent to an engine without pause, two at a time."""

    def __init__(self, base_url: str, served: str):
        self.items = recall.load_heldout()
        self.base_url, self.served = base_url, served
        self.stop = threading.Event()
        self.done = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, k: int) -> None:
        i = k
        while not self.stop.is_set():
            it = self.items[i % len(self.items)]
            try:
                recall.complete_many(self.base_url, self.served, [it], concurrency=1)
                self.done += 1
            except Exception:  # noqa: BLE001  an engine restart or shutdown: keep going until stopped
                time.sleep(1)
            i += 2

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _probes(items):
    return {
        "intervalSeconds": 15,
        "timeoutSeconds": 10,
        "failureThreshold": 3,
        "prompts": [
            {"name": f"learn-{i}", "promptTokenIds": it["prompt_token_ids"], "maxTokens": it["max_tokens"]}
            for i, it in enumerate(items[:2])
        ],
    }


def _pod(k: Kube, ns: str, name: str):
    def one():
        pods = [
            p
            for p in k.engine_pods(ns, name)
            if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
        ]
        return pods[0] if len(pods) == 1 else None

    pod = wait_for(one, 120, what=f"the running kwok engine pod of {ns}/{name}")
    assert pod.status.pod_ip.startswith("127."), pod.status.pod_ip
    return pod


@pytest.fixture(scope="module")
def stack(full_cluster, kube_api, tmp_path_factory):
    cp = full_cluster
    tools()  # helm (hack/tools.sh)
    work = tmp_path_factory.mktemp("monitoring-live")
    python = require_engine_python()
    paths = find_monitoring(build=True)
    k = Kube(kube_api)
    sfx = uuid.uuid4().hex[:5]
    rel, rel_ns = f"gdnm{sfx}", f"gdn-mon-{sfx}"
    ns_ok, ns_bad, ns_crash = f"mon-ok-{sfx}", f"mon-bad-{sfx}", f"mon-crash-{sfx}"
    mon_ns = f"monitoring-{sfx}"
    for ns in (ns_ok, ns_bad, ns_crash, mon_ns):
        k.create_namespace(ns)
    install_crd(kube_api)
    cleanup: list = []
    try:
        # -- the Prometheus Operator + a Prometheus selecting like kube-prometheus-stack's defaults ------------
        promop = PrometheusOperator(cp, paths, work).start()
        cleanup.append(promop.stop)
        sel = {"matchLabels": {"release": KPS}}
        co = client.CustomObjectsApi(kube_api)

        def prometheus(name, monitors):  # monitors: the selector for ServiceMonitors, PodMonitors and Probes
            co.create_namespaced_custom_object(
                "monitoring.coreos.com",
                "v1",
                mon_ns,
                "prometheuses",
                {
                    "apiVersion": "monitoring.coreos.com/v1",
                    "kind": "Prometheus",
                    "metadata": {"name": name},
                    "spec": {
                        "version": prometheus_version(paths.prometheus),
                        "replicas": 1,
                        "scrapeInterval": "5s",
                        "evaluationInterval": "5s",
                        "serviceMonitorSelector": monitors,
                        "serviceMonitorNamespaceSelector": {},
                        "podMonitorSelector": monitors,
                        "podMonitorNamespaceSelector": {},
                        "ruleSelector": sel,
                        "ruleNamespaceSelector": {},
                        "probeSelector": monitors,
                        "probeNamespaceSelector": {},
                    },
                },
            )

        prometheus(PROM, sel)
        # the negative control (issue 28: "the label fix is proven by that test failing on today's monitors"): a
        # second Prometheus with today's chart rules that sees the monitors as they were before the fix — the
        # chart's ServiceMonitor without honorLabels (as the chart rendered it, git 63f06e0), and no engine
        # PodMonitor (the per-server PodMonitors then carried no label, so kube-prometheus-stack's `release`
        # selector matched none)
        pre_sel = {"matchLabels": {"gdn-test": PRE_FIX}}
        prometheus(PRE_FIX, pre_sel)

        # -- the chart, monitoring on, tuned for a short test through its values ---------------------------------
        # its pod goes to a kwok node that gives it a non-loopback address of this machine: the API server
        # rejects 127.x in EndpointSlices, so over a 127.x pod the metrics Service has no endpoints and the
        # ServiceMonitor's job no target (tests/cluster/monitoring.py)
        host_ip = os.environ.get(SERVICE_HOST_ENV)
        assert host_ip, f"{SERVICE_HOST_ENV} unset: run by tests/integration/test_monitoring_live.py in its own network namespace"
        node = ServiceHostNode(kube_api, f"service-host-{sfx}", host_ip, FAKE_NODE_ANNOTATION).create()
        cleanup.append(node.delete)
        op = OperatorProcess(cp, work / "operator", webhook=True)
        sets = {
            "replicaCount": 1,
            "peering.enabled": False,
            "webhook.enabled": False,
            "metrics.port": op.metrics_port,
            "nodeSelector": node.node_selector(),
            "tolerations": node.tolerations(),
            "operator.watchNamespaces": [ns_ok, ns_bad, ns_crash],
            "monitoring.serviceMonitor.interval": "5s",
            "monitoring.prometheusRule.acceptanceCollapse.for": "30s",
        }
        helm(
            "install",
            rel,
            str(CHART),
            "-n",
            rel_ns,
            "--create-namespace",
            "--take-ownership",
            "--force-conflicts",
            *value_args(VALUE_SETS["monitoring"], sets),
            kubeconfig=str(cp.kubeconfig),
        )
        cleanup.append(lambda: helm("uninstall", rel, "-n", rel_ns, "--wait=false", check=False, kubeconfig=str(cp.kubeconfig)))
        manifest = docs(helm("get", "manifest", rel, "-n", rel_ns, kubeconfig=str(cp.kubeconfig)).stdout)
        sm = next(o for o in manifest if o["kind"] == "ServiceMonitor")
        assert all(ep.get("honorLabels") is True for ep in sm["spec"]["endpoints"]), sm  # the fix
        co.create_namespaced_custom_object(
            "monitoring.coreos.com",
            "v1",
            rel_ns,
            "servicemonitors",
            {
                "apiVersion": sm["apiVersion"],
                "kind": sm["kind"],
                "metadata": {"name": f"{sm['metadata']['name']}-{PRE_FIX}", "labels": pre_sel["matchLabels"]},
                "spec": {
                    **sm["spec"],
                    "endpoints": [{k: v for k, v in ep.items() if k != "honorLabels"} for ep in sm["spec"]["endpoints"]],
                },
            },
        )
        dep = next(o for o in manifest if o["kind"] == "Deployment")
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        chart_env = {e["name"]: e["value"] for e in c["env"] if "value" in e and not e["name"].startswith(OWN_ENV)}
        op_pod = wait_for(
            lambda: next(
                (p for p in k.core.list_namespaced_pod(rel_ns).items if p.status.pod_ip and p.status.phase == "Running"), None
            ),
            120,
            what="the chart's operator pod (kwok)",
        )
        assert op_pod.spec.node_name == node.name and op_pod.status.pod_ip == host_ip, (
            op_pod.spec.node_name,
            op_pod.status.pod_ip,
        )
        # the chart's metrics Service has the operator's pod as its endpoint (what the ServiceMonitor's job reads)
        disc = client.DiscoveryV1Api(kube_api)
        wait_for(
            lambda: any(
                host_ip in (ep.addresses or [])
                for sl in disc.list_namespaced_endpoint_slice(rel_ns).items
                for ep in (sl.endpoints or [])
            ),
            60,
            interval=1,
            what=f"an EndpointSlice in {rel_ns} with {host_ip}",
        )
        # the real operator stands in for the chart's pod: same env, metrics on <pod IP>:<metrics.port>
        op.extra_env.update(chart_env, POD_NAMESPACE=rel_ns, GDN_ACCEPTANCE_WINDOW="30", GDN_WEBHOOK_CONFIG_NAME=WEBHOOK_CONFIG)
        op.start()
        cleanup.append(lambda: delete_webhook_configs(kube_api, WEBHOOK_CONFIG))
        cleanup.append(op.stop)

        # -- servers: healthy and broken MTP (real engines), a fake one that crashes, one denied change -------------
        # prefix caching set on by the user + MTP on 0.28 (vllm#43559): denied (unset, it resolves to off)
        known_crash = gms(
            "denied", image={"tag": "v0.28.0", "vllmVersion": "0.28.0"}, admissionPolicy="reject", prefixCaching=True
        )
        adm = client.AdmissionregistrationV1Api(kube_api)
        wait_for(lambda: adm.read_validating_webhook_configuration(WEBHOOK_CONFIG).webhooks, 60, what="the webhook configuration")

        def deny():  # the API server picks up a fresh webhook configuration after a moment
            try:
                k.create(ns_ok, known_crash)
            except ApiException as e:
                return e if e.status == 403 else None
            k.delete(ns_ok, "denied")
            return None

        wait_for(deny, 60, interval=1, what="the webhook denying a known-crashing config")
        items = recall.load_heldout()
        ok, bad, crashy = "tiny-ok", "tiny-broken", "crashy"
        for ns, name in ((ns_ok, ok), (ns_bad, bad)):
            k.create(ns, gms(name, metrics={"scrapeIntervalSeconds": 5}, probes=_probes(items)))
        # asyncScheduling set on by the user: the remediation of the crash below has something to change
        # (unset, it resolves to the value the rules accept and no automatic workaround is left)
        k.create(ns_crash, gms(crashy, remediation={"mode": "auto", "threshold": 2}, asyncScheduling=True))
        pods = {name: _pod(k, ns, name) for ns, name in ((ns_ok, ok), (ns_bad, bad), (ns_crash, crashy))}

        engines = {}
        cores = dict(zip((ok, bad), own_cores(2)))  # both engines busy at once: each on its own core

        def serve(name, weights):
            engines[name] = start_engine(
                work / f"engine-{name}",
                python,
                420,
                ["--gpu-memory-utilization", "0.05"],
                weights_dir=weights,
                served_name=name,
                max_model_len=1024,
                host=pods[name].status.pod_ip,
                port=ENGINE_PORT,
                extra_env=cores[name],
            )

        threads = [threading.Thread(target=serve, args=a) for a in ((ok, recall.MODEL_DIR), (bad, BROKEN_MODEL))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in engines.values():
            cleanup.append(lambda e=e: stop_engine(e))
        assert set(engines) == {ok, bad}, f"engine start failed (logs under {work})"
        # each engine computes on its own core (vLLM's log says where it bound its threads)
        bound = {n: re.findall(r"core ids=\[([^\]]*)\]", e.log_path.read_text()) for n, e in engines.items()}
        assert all(len(b) == 1 for b in bound.values()) and bound[ok] != bound[bad], bound
        traffic = [Traffic(engines[n].base_url, n) for n in (ok, bad)]
        for t in traffic:
            cleanup.append(t.close)

        # crash the fake engine twice with a known signature: the crash watch counts it, remediation applies once
        msg = tail("b9-np-repeat-negative.tail.log")
        for _ in range(2):
            crash(k, ns_crash, pods[crashy].metadata.name, msg)
        wait_for(
            lambda: [r for r in k.status(ns_crash, crashy).get("remediations") or [] if r.get("changes")] or None,
            60,
            what="remediation of crashy (asyncScheduling=false)",
        )

        # -- Prometheus on the generated configuration, once it holds our monitors and rules ---------------------
        want_jobs = {f"serviceMonitor/{rel_ns}/", f"podMonitor/{ns_ok}/{ok}/", f"podMonitor/{ns_bad}/{bad}/"}

        def config_ready():
            got = generated_config(kube_api, mon_ns, PROM)
            if not got:
                return None
            cfg, rules = got
            jobs = " ".join(j["job_name"] for j in cfg.get("scrape_configs") or [])
            return (
                got
                if all(w in jobs for w in want_jobs) and any("GDNSpecAcceptanceCollapse" in r for r in rules.values())
                else None
            )

        cfg, rules = wait_for(
            config_ready, 120, interval=1, what=f"generated Prometheus config with {want_jobs} (log {promop.log})"
        )
        prom = PrometheusServer(paths.prometheus, localize(cfg, rules, cp.kubeconfig, work, f"prometheus-{PROM}-0"), work).start()
        cleanup.append(prom.stop)

        def pre_config_ready():
            got = generated_config(kube_api, mon_ns, PRE_FIX)
            jobs = " ".join(j["job_name"] for j in (got[0].get("scrape_configs") or [])) if got else ""
            return got if f"serviceMonitor/{rel_ns}/{sm['metadata']['name']}-{PRE_FIX}/" in jobs and got[1] else None

        pre_cfg, pre_rules = wait_for(pre_config_ready, 120, interval=1, what=f"generated config of Prometheus {PRE_FIX}")
        pre_work = work / PRE_FIX
        pre_work.mkdir()
        pre = PrometheusServer(
            paths.prometheus, localize(pre_cfg, pre_rules, cp.kubeconfig, pre_work, f"prometheus-{PRE_FIX}-0"), pre_work
        ).start()
        cleanup.append(pre.stop)
        yield {
            "prom": prom,
            "pre": pre,
            "pre_cfg": pre_cfg,
            "k": k,
            "op": op,
            "rel_ns": rel_ns,
            "ok": (ns_ok, ok),
            "bad": (ns_bad, bad),
            "crashy": (ns_crash, crashy),
            "manifest": manifest,
            "cfg": cfg,
            "traffic": traffic,
            "work": work,
        }
    finally:
        for fn in reversed(cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001  best-effort teardown
                pass
        for ns in (ns_ok, ns_bad, ns_crash, mon_ns):
            try:
                k.core.delete_namespace(ns)
            except ApiException:
                pass


def _series(prom, expr):
    return prom.query(expr)


def test_prometheus_scrapes_operator_and_engines_with_their_servers_labels(stack):
    prom, (ns_ok, ok), (ns_bad, bad) = stack["prom"], stack["ok"], stack["bad"]

    def all_up():
        ts = prom.targets()
        up = [t for t in ts if t["health"] == "up"]
        pools = " ".join(t["scrapePool"] for t in up)
        return (
            ts
            if all(
                p in pools
                for p in (f"serviceMonitor/{stack['rel_ns']}/", f"podMonitor/{ns_ok}/{ok}/", f"podMonitor/{ns_bad}/{bad}/")
            )
            else None
        )

    targets, met = poll(all_up, timeout=300, interval=5)
    assert met, "operator and both engines not all scraped: " + json.dumps(
        [(t["scrapePool"], t["health"], t.get("lastError"), t["scrapeUrl"]) for t in prom.targets()]
    )
    eng = [t for t in targets if t["scrapePool"].startswith(f"podMonitor/{ns_ok}/")]
    assert eng[0]["labels"]["server"] == ok and eng[0]["labels"]["namespace"] == ns_ok
    # the operator's series keep the servers' namespace (honorLabels), never exported_namespace
    rows = wait_for(
        lambda: _series(prom, f'gdn_ready_replicas{{server="{bad}"}}') or None,
        60,
        interval=2,
        what="gdn_ready_replicas of the broken server",
    )
    assert {r["metric"]["namespace"] for r in rows} == {ns_bad}
    assert not _series(prom, 'count({__name__=~"gdn_.+", exported_namespace!=""})')
    # vLLM's series carry the same namespace + server
    vllm = wait_for(
        lambda: _series(prom, f'vllm:generation_tokens_total{{server="{bad}"}}') or None,
        60,
        interval=2,
        what="vLLM series of the broken server",
    )
    assert {r["metric"]["namespace"] for r in vllm} == {ns_bad}


def _dashboard(stack) -> dict:
    cm = next(o for o in stack["manifest"] if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard"))
    (text,) = cm["data"].values()
    return json.loads(text)


def _substitute(expr: str, values: dict[str, str]) -> str:
    for k in sorted(values, key=len, reverse=True):
        expr = expr.replace(k, values[k])
    assert "$" not in expr, expr
    return expr


def test_every_dashboard_query_returns_series(stack):
    prom = stack["prom"]
    (ns_ok, ok), (ns_bad, bad), (ns_crash, crashy) = stack["ok"], stack["bad"], stack["crashy"]
    d = _dashboard(stack)
    # the variables, as Grafana would fill them: each must offer our namespaces / servers / models (the crashing
    # server has no real engine, so no vLLM series and no served model: its data are the crash panels')
    wants = {"namespace": {ns_ok, ns_bad, ns_crash}, "server": {ok, bad, crashy}, "model": {ok, bad}}
    values = dict(GRAFANA)
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"])
        expr = _substitute(m.group(1), values)
        want = wants[v["name"]]

        got, _ = poll(
            lambda m=m, expr=expr: {r["metric"].get(m.group(2)) for r in _series(prom, expr)},
            until=lambda got, want=want: want <= got,
            timeout=120,
            interval=2,
        )
        assert want <= got, (v["name"], want, got)
        values[f"${v['name']}"] = "|".join(sorted(want))
    targets = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 30

    # every query has data once traffic, probes, crashes and the denial have been scraped
    # (1m rate windows: poll for positive evidence, never a fixed sleep)
    def missing():
        return [(title, e) for title, e in targets if not _series(prom, _substitute(e, values))]

    left, ok_ = poll(missing, until=lambda m: not m, timeout=180, interval=5)
    assert ok_, f"dashboard panels without series: {left}"


def _alerts(prom, name=None):
    return [a for a in prom.alerts() if name is None or a["labels"]["alertname"] == name]


def test_acceptance_alert_fires_for_broken_mtp_only(stack):
    prom = stack["prom"]
    (_, ok), (ns_bad, bad) = stack["ok"], stack["bad"]
    name = "GDNSpecAcceptanceCollapse"
    for_s, eval_s = 30, 5  # the chart's acceptanceCollapse.for as the stack sets it; the Prometheus evaluationInterval

    def state():
        mine = [a for a in _alerts(prom, name) if a["labels"].get("server") == bad]
        healthy = [a for a in _alerts(prom, name) if a["labels"].get("server") == ok]
        assert not healthy, f"{name} for the healthy server: {healthy}"
        return next((a for a in mine if a["state"] == "firing"), None)

    firing = wait_for(state, 300, interval=1, what=f"{name} firing for {ns_bad}/{bad}")

    # pending -> firing within for:, from Prometheus' own record of its alert states (the ALERTS series, one
    # sample per evaluation), whenever the earlier tests let it happen
    def first(alertstate):
        res = prom.api(
            "query", query=f'ALERTS{{alertname="{name}", namespace="{ns_bad}", server="{bad}", alertstate="{alertstate}"}}[1h]'
        )["result"]
        return min((float(t) for r in res for t, _ in r["values"]), default=None)

    pending_at, firing_at = first("pending"), first("firing")
    # when the alert became active, as Prometheus holds it (the first pending evaluation; under load an evaluation
    # can be missed, so the first *retained* pending sample may come one interval later — seen once: 25 s)
    # (activeAt has microseconds; samples are stored in whole milliseconds, truncated: compare at that precision)
    active_at = datetime.fromisoformat(firing["activeAt"].replace("Z", "+00:00")).timestamp()
    active_at = math.floor(active_at * 1000) / 1000
    assert pending_at is not None and active_at - 1 <= pending_at < firing_at, (firing["activeAt"], pending_at, firing_at)
    assert firing_at is not None and for_s - 0.001 <= firing_at - active_at <= for_s + 3 * eval_s, (active_at, firing_at)
    # the healthy server never had an alert firing over the whole run. (Pending is possible: kwok marks its pod
    # Ready before the real engine listens, so its output probes fail to connect for up to a minute and
    # GDNProbesFailing may go pending — ProbeUnreachable — until the probes learn their answers; for: outlasts it.)
    assert not prom.api("query", query=f'ALERTS{{server="{ok}", alertstate="firing"}}[1h]')["result"]
    assert firing["labels"]["namespace"] == ns_bad and firing["labels"]["server"] == bad
    assert firing["annotations"]["runbook_url"].endswith(f"/{name}.md")
    assert f"{ns_bad}/{bad}" in firing["annotations"]["summary"]
    # the healthy server was judged by the same rule over the same time, with data: high acceptance, drafting
    acc = {r["metric"]["server"]: float(r["value"][1]) for r in _series(prom, "max by (server) (gdn_spec_acceptance_rate)")}
    dps = {r["metric"]["server"]: float(r["value"][1]) for r in _series(prom, "max by (server) (gdn_spec_drafts_per_second)")}
    served = {t.served: t.done for t in stack["traffic"]}  # answers each engine gave the test's traffic so far
    assert acc[ok] > 0.5 and dps[ok] >= 0.5, (acc, dps, served)
    assert acc[bad] < 0.2 and dps[bad] >= 0.5, (acc, dps)
    held = _series(prom, f'min_over_time(gdn_spec_acceptance_rate{{server="{ok}"}}[30s]) > 0.2')
    assert held, "the healthy server's acceptance held above the threshold for the alert's `for:`"
    assert not [a for a in _alerts(prom) if a["labels"].get("server") == ok and a["state"] == "firing"]


def test_every_firing_alert_names_its_own_server(stack):
    prom, k = stack["prom"], stack["k"]
    firing = [a for a in _alerts(prom) if a["state"] == "firing"]
    assert firing
    for a in firing:
        lab = a["labels"]
        if "server" in lab:
            obj = k.get(lab["namespace"], lab["server"])  # 404 if the pair names no GDNModelServer
            assert obj["metadata"]["name"] == lab["server"]
        else:
            assert lab["alertname"] in ("GDNAdmissionDenialsSpike", "GDNOperatorDown"), lab
        assert "exported_namespace" not in lab, lab


def test_pre_fix_monitors_fail_the_label_assertions(stack):
    """The negative control: the same operator, engines and chart rules seen through the monitors of before the
    fix (the second Prometheus of the stack) fail the label assertions above: the operator's series name the
    operator's namespace (the server's is renamed exported_namespace), so the dashboard's $namespace variable
    offers no server namespace, no engine is scraped at all, and the acceptance alert for the broken server
    names a GDNModelServer that does not exist."""
    pre, k, rel_ns = stack["pre"], stack["k"], stack["rel_ns"]
    (ns_ok, _), (ns_bad, bad) = stack["ok"], stack["bad"]
    jobs = [j["job_name"] for j in stack["pre_cfg"]["scrape_configs"]]
    assert [j for j in jobs if j.startswith(f"serviceMonitor/{rel_ns}/")], jobs
    assert not [j for j in jobs if j.startswith("podMonitor/")], jobs  # kube-prometheus-stack selected no engine
    rows = wait_for(
        lambda: _series(pre, f'gdn_ready_replicas{{server="{bad}"}}') or None,
        120,
        interval=2,
        what=f"gdn_ready_replicas of the broken server in Prometheus {PRE_FIX}",
    )
    assert {r["metric"]["namespace"] for r in rows} == {rel_ns}, rows
    assert {r["metric"].get("exported_namespace") for r in rows} == {ns_bad}, rows
    assert _series(pre, 'count({__name__=~"gdn_.+", exported_namespace!=""})')
    # the dashboard's $namespace variable (label_values(gdn_ready_replicas, namespace)): the operator's only
    (var,) = [v for v in _dashboard(stack)["templating"]["list"] if v.get("name") == "namespace"]
    assert var["query"] == "label_values(gdn_ready_replicas, namespace)", var["query"]
    assert {r["metric"]["namespace"] for r in _series(pre, "gdn_ready_replicas")} == {rel_ns}
    assert not {ns_ok, ns_bad} & {r["metric"]["namespace"] for r in _series(pre, "gdn_ready_replicas")}
    # the chart's acceptance alert fires for the broken server, under the operator's namespace
    name = "GDNSpecAcceptanceCollapse"
    firing = wait_for(
        lambda: next((a for a in _alerts(pre, name) if a["labels"].get("server") == bad and a["state"] == "firing"), None),
        300,
        interval=2,
        what=f"{name} firing for {bad} in Prometheus {PRE_FIX}",
    )
    assert firing["labels"]["namespace"] == rel_ns, firing["labels"]
    with pytest.raises(ApiException) as e:
        k.get(rel_ns, bad)  # the pair the alert names: no such GDNModelServer
    assert e.value.status == 404
