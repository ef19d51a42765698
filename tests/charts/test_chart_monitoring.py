"""The PrometheusRule and the Grafana dashboard, checked with the real promtool.

- `promtool check rules` on the rendered rule groups;
- `promtool test rules`: for every alert, input series that FIRE it and series that must NOT;
- dashboard JSON: structure, sidecar label, and every panel query parsed by promtool (as recording
  rules, after substituting Grafana's variables); every metric name exists (operator registry /
  the real vLLM 0.32.0 exposition fixture).

Size (~570 lines): the rules' promtool cases (fire / must not fire) for every alert sit beside the alert they
test; the dashboard checks share the same rendered chart.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from _chart_helpers import DASHBOARD, NAMESPACE, RELEASE, VALUE_SETS, docs, one, render_set, render_text
from paths import CPU_CAPTURES

VLLM_FIXTURE = CPU_CAPTURES / "metrics-mtp2.prom"
METRICS_SVC = f"{RELEASE}-gdn-operator-metrics"
ALERTS = {
    "GDNEngineDead",
    "GDNEngineCrashLoop",
    "GDNSpecAcceptanceCollapse",
    "GDNEngineScrapeFailures",
    "GDNAdmissionDenialsSpike",
    "GDNOperatorDown",
    "GDNOutputInconsistent",
    "GDNProbesFailing",
    "GDNEngineStalled",
}


def promtool(chart_tools, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([chart_tools["promtool"], *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def rule_groups(chart_tools):
    rule = one(render_set("monitoring"), "PrometheusRule")
    return rule["spec"]["groups"]


def test_rules_pass_promtool_check(chart_tools, rule_groups, tmp_path):
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule_groups}))
    res = promtool(chart_tools, "check", "rules", str(f))
    assert res.returncode == 0, res.stdout + res.stderr
    n = sum(len(g["rules"]) for g in rule_groups)
    assert f"SUCCESS: {n} rules found" in res.stdout
    assert {r["alert"] for g in rule_groups for r in g["rules"]} == ALERTS


def test_promtool_rejects_a_broken_rule(chart_tools, rule_groups, tmp_path):
    """The check above can fail: a syntax error in an expression is reported."""
    broken = copy.deepcopy(rule_groups)
    broken[0]["rules"][0]["expr"] = "max by (namespace (gdn_ready_replicas)"
    f = tmp_path / "broken.yaml"
    f.write_text(yaml.safe_dump({"groups": broken}))
    res = promtool(chart_tools, "check", "rules", str(f))
    assert res.returncode != 0 and "parse error" in (res.stdout + res.stderr)


def s(series: str, values: str) -> dict:
    return {"series": series, "values": values}


def fires(alert: str, at: str, labels: dict) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": labels}]}


def silent(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


SRV = 'namespace="ml",server="qwen"'
OP0, OP1 = 'pod="gdn-op-0"', 'pod="gdn-op-1"'
IN0, IN1 = 'instance="10.0.0.5:8080"', 'instance="10.0.0.6:8080"'  # the operator replicas of a per-engine-pod series
B1 = 'signature="gdn-mixed-batch-assert",upstream="vllm#36917"'
CASES = [
    # ---- GDNEngineDead ------------------------------------------------------------------------
    (
        "engine dead: no ready replica, restarts climbing",
        [
            s(f"gdn_ready_replicas{{{SRV},{OP0}}}", "1 1 0x40"),
            s(f"gdn_engine_restarts{{{SRV},{OP0}}}", "0 0 1 1 2 2 3 3 4 4 5 5 6 6 7 7 8 8 9 9 10x30"),
        ],
        [fires("GDNEngineDead", "10m", {"severity": "critical", "namespace": "ml", "server": "qwen"})],
    ),
    (
        "engine dead: crashes counted by the crash watch, restarts unknown",
        [
            s(f"gdn_ready_replicas{{{SRV},{OP0}}}", "0x40"),
            s(f"gdn_engine_crashes_total{{{SRV},{B1},{OP0}}}", "0 1 2 2 2 2 2 2 2 2x30"),
        ],
        [fires("GDNEngineDead", "8m", {"severity": "critical", "namespace": "ml", "server": "qwen"})],
    ),
    (
        "not dead: scaled to zero, nothing restarts",
        [
            s(f"gdn_ready_replicas{{{SRV},{OP0}}}", "0x40"),
            s(f"gdn_engine_restarts{{{SRV},{OP0}}}", "3x40"),
        ],
        [silent("GDNEngineDead", "30m")],
    ),
    (
        "not dead: restarts but one replica still ready (a stale 0 from a standby is ignored by max)",
        [
            s(f"gdn_ready_replicas{{{SRV},{OP0}}}", "1x40"),
            s(f"gdn_ready_replicas{{{SRV},{OP1}}}", "0x40"),
            s(f"gdn_engine_restarts{{{SRV},{OP0}}}", "0+1x40"),
        ],
        [silent("GDNEngineDead", "20m")],
    ),
    (
        "not dead yet: only 1 minute without a ready replica (for: 2m)",
        [
            s(f"gdn_ready_replicas{{{SRV},{OP0}}}", "1x9 0x5"),
            s(f"gdn_engine_restarts{{{SRV},{OP0}}}", "0x9 1x5"),
        ],
        [
            silent("GDNEngineDead", "10m"),
            fires("GDNEngineDead", "12m", {"severity": "critical", "namespace": "ml", "server": "qwen"}),
        ],
    ),
    # ---- GDNEngineCrashLoop -------------------------------------------------------------------
    (
        "crash loop: same signature every 3 minutes",
        [
            s(f"gdn_engine_crashes_total{{{SRV},{B1},{OP0}}}", "0 0 0 1 1 1 2 2 2 3 3 3 4 4 4 5x30"),
        ],
        [
            fires(
                "GDNEngineCrashLoop",
                "15m",
                {
                    "severity": "critical",
                    "namespace": "ml",
                    "server": "qwen",
                    "signature": "gdn-mixed-batch-assert",
                    "upstream": "vllm#36917",
                },
            )
        ],
    ),
    (
        "crash loop: counted over both operator replicas (sum)",
        [
            s(f"gdn_engine_crashes_total{{{SRV},{B1},{OP0}}}", "0 0 1 1 2 2 2x30"),
            s(f"gdn_engine_crashes_total{{{SRV},{B1},{OP1}}}", "0 0 0 0 0 1 2 2x30"),
        ],
        [
            fires(
                "GDNEngineCrashLoop",
                "10m",
                {
                    "severity": "critical",
                    "namespace": "ml",
                    "server": "qwen",
                    "signature": "gdn-mixed-batch-assert",
                    "upstream": "vllm#36917",
                },
            )
        ],
    ),
    (
        "no crash loop: two crashes in an hour",
        [
            s(f"gdn_engine_crashes_total{{{SRV},{B1},{OP0}}}", "0x10 1x20 2x40"),
        ],
        [silent("GDNEngineCrashLoop", "40m"), silent("GDNEngineCrashLoop", "65m")],
    ),
    (
        "no crash loop: three different signatures once each",
        [
            s(f'gdn_engine_crashes_total{{{SRV},signature="a",upstream="x",{OP0}}}', "0 1x40"),
            s(f'gdn_engine_crashes_total{{{SRV},signature="b",upstream="y",{OP0}}}', "0 0 1x40"),
            s(f'gdn_engine_crashes_total{{{SRV},signature="c",upstream="z",{OP0}}}', "0 0 0 1x40"),
        ],
        [silent("GDNEngineCrashLoop", "10m")],
    ),
    # ---- GDNSpecAcceptanceCollapse ------------------------------------------------------------
    (
        "acceptance collapse under load",
        [
            s(f"gdn_spec_acceptance_rate{{{SRV},{OP0}}}", "0.8x10 0.05x40"),
            s(f"gdn_spec_drafts_per_second{{{SRV},{OP0}}}", "40x50"),
        ],
        [
            silent("GDNSpecAcceptanceCollapse", "20m"),
            fires("GDNSpecAcceptanceCollapse", "30m", {"severity": "warning", "namespace": "ml", "server": "qwen"}),
        ],
    ),
    (
        "no collapse: idle engine (no drafts) reports 0 acceptance",
        [
            s(f"gdn_spec_acceptance_rate{{{SRV},{OP0}}}", "0x50"),
            s(f"gdn_spec_drafts_per_second{{{SRV},{OP0}}}", "0x50"),
        ],
        [silent("GDNSpecAcceptanceCollapse", "40m")],
    ),
    (
        "no collapse: healthy MTP acceptance",
        [
            s(f"gdn_spec_acceptance_rate{{{SRV},{OP0}}}", "0.72x50"),
            s(f"gdn_spec_drafts_per_second{{{SRV},{OP0}}}", "40x50"),
        ],
        [silent("GDNSpecAcceptanceCollapse", "40m")],
    ),
    # ---- GDNEngineScrapeFailures --------------------------------------------------------------
    (
        "scrape failures: a timeout every minute",
        [
            s(f'gdn_scrape_errors_total{{{SRV},reason="timeout",{OP0}}}', "0+1x40"),
        ],
        [
            fires(
                "GDNEngineScrapeFailures",
                "30m",
                {"severity": "warning", "namespace": "ml", "server": "qwen", "reason": "timeout"},
            )
        ],
    ),
    (
        "no scrape alert: a failure every 5 minutes",
        [
            s(f'gdn_scrape_errors_total{{{SRV},reason="connect",{OP0}}}', "0+0.2x40"),
        ],
        [silent("GDNEngineScrapeFailures", "30m")],
    ),
    # ---- GDNAdmissionDenialsSpike -------------------------------------------------------------
    (
        "denial spike: a pipeline retries a rejected config",
        [
            s(f'gdn_admission_decisions_total{{namespace="ml",decision="denied",rule="b7-prefix-caching-mtp",{OP0}}}', "0+1x30"),
            s(f'gdn_admission_decisions_total{{namespace="ml",decision="denied",rule="invalid-spec",{OP1}}}', "0+1x30"),
        ],
        [fires("GDNAdmissionDenialsSpike", "15m", {"severity": "info", "namespace": "ml"})],
    ),
    (
        "no spike: many admissions, few denials",
        [
            s(f'gdn_admission_decisions_total{{namespace="ml",decision="admitted",rule="",{OP0}}}', "0+10x30"),
            s(f'gdn_admission_decisions_total{{namespace="ml",decision="denied",rule="b1",{OP0}}}', "0+0.2x30"),
        ],
        [silent("GDNAdmissionDenialsSpike", "20m")],
    ),
    # ---- GDNOutputInconsistent ----------------------------------------------------------------
    (
        "output inconsistent: the operator raised OutputConsistent=False (ProbeMismatch)",
        [
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeMismatch",{OP0}}}', "0x5 1x20"),
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeError",{OP0}}}', "0x25"),
        ],
        [
            silent("GDNOutputInconsistent", "5m"),
            fires(
                "GDNOutputInconsistent",
                "8m",
                {"severity": "critical", "namespace": "ml", "server": "qwen", "reason": "ProbeMismatch"},
            ),
        ],
    ),
    (
        "output inconsistent: one active replica reports it, the standby's stale 0 is ignored (max)",
        [
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeEarlyStop",{OP0}}}', "1x20"),
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeEarlyStop",{OP1}}}', "0x20"),
        ],
        [
            fires(
                "GDNOutputInconsistent",
                "5m",
                {"severity": "critical", "namespace": "ml", "server": "qwen", "reason": "ProbeEarlyStop"},
            )
        ],
    ),
    (
        "output consistent: probes pass (gauge 0), and a 30 s flip shorter than `for` does not fire",
        [
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeMismatch",{OP0}}}', "0x10 1 0x10"),
        ],
        [silent("GDNOutputInconsistent", "5m"), silent("GDNOutputInconsistent", "11m"), silent("GDNOutputInconsistent", "15m")],
    ),
    # ---- GDNProbesFailing (issue 38): no answer is a warning, never the critical page -------------
    (
        "probes get 401 (no API key): GDNProbesFailing warns after `for` (10m), GDNOutputInconsistent stays silent",
        [
            s(f'gdn_probe_failing{{namespace="ml",server="qwen",reason="ProbeUnauthorized",{OP0}}}', "0x2 1x20"),
            s(f'gdn_output_inconsistent{{namespace="ml",server="qwen",reason="ProbeMismatch",{OP0}}}', "0x22"),
        ],
        [
            silent("GDNProbesFailing", "8m"),
            fires(
                "GDNProbesFailing",
                "14m",
                {"severity": "warning", "namespace": "ml", "server": "qwen", "reason": "ProbeUnauthorized"},
            ),
            silent("GDNOutputInconsistent", "14m"),
        ],
    ),
    (
        "probe timeouts shorter than `for` do not fire",
        [s(f'gdn_probe_failing{{namespace="ml",server="qwen",reason="ProbeTimeout",{OP0}}}', "0x2 1x5 0x10")],
        [silent("GDNProbesFailing", "6m"), silent("GDNProbesFailing", "12m")],
    ),
    # ---- GDNEngineStalled (issue 24) ------------------------------------------------------------
    # the series carry the engine pod as `pod` (ServiceMonitor honorLabels); operator replicas differ by instance
    (
        "engine stalled: the detector flags one pod for longer than `for` (5m)",
        [
            s(f'gdn_engine_stalled{{namespace="ml",server="qwen",pod="qwen-0",{IN0}}}', "0x5 1x20"),
            s(f'gdn_engine_stalled{{namespace="ml",server="qwen",pod="qwen-1",{IN0}}}', "0x25"),
        ],
        [
            silent("GDNEngineStalled", "9m"),
            fires("GDNEngineStalled", "12m", {"severity": "critical", "namespace": "ml", "server": "qwen", "pod": "qwen-0"}),
        ],
    ),
    (
        "engine stalled: the standby replica's stale 0 does not hide the active one's 1 (max)",
        [
            s(f'gdn_engine_stalled{{namespace="ml",server="qwen",pod="qwen-0",{IN0}}}', "1x20"),
            s(f'gdn_engine_stalled{{namespace="ml",server="qwen",pod="qwen-0",{IN1}}}', "0x20"),
        ],
        [fires("GDNEngineStalled", "10m", {"severity": "critical", "namespace": "ml", "server": "qwen", "pod": "qwen-0"})],
    ),
    (
        "engine not stalled: a stall the operator's restart ended within `for` does not fire",
        [
            s(f'gdn_engine_stalled{{namespace="ml",server="qwen",pod="qwen-0",{IN0}}}', "0x5 1x3 0x20"),
        ],
        [silent("GDNEngineStalled", "8m"), silent("GDNEngineStalled", "15m")],
    ),
    # ---- GDNOperatorDown ----------------------------------------------------------------------
    (
        "operator down: no replica up",
        [
            s(f'up{{job="{METRICS_SVC}",namespace="{NAMESPACE}",pod="a"}}', "1x5 0x30"),
            s(f'up{{job="{METRICS_SVC}",namespace="{NAMESPACE}",pod="b"}}', "1x5 0x30"),
        ],
        [silent("GDNOperatorDown", "10m"), fires("GDNOperatorDown", "20m", {"severity": "critical"})],
    ),
    (
        "operator up: one replica of two is down",
        [
            s(f'up{{job="{METRICS_SVC}",namespace="{NAMESPACE}",pod="a"}}', "1x30"),
            s(f'up{{job="{METRICS_SVC}",namespace="{NAMESPACE}",pod="b"}}', "0x30"),
        ],
        [silent("GDNOperatorDown", "25m")],
    ),
]


def test_every_alert_has_firing_and_silent_cases():
    fired = {t["alertname"] for _, _, ts in CASES for t in ts if t["exp_alerts"]}
    quiet = {t["alertname"] for _, _, ts in CASES for t in ts if not t["exp_alerts"]}
    assert fired == ALERTS and quiet == ALERTS


def _write_rules_without_annotations(rule_groups, path: Path) -> None:
    # promtool test compares annotations too; their templates are validated by `check rules` above,
    # here only the expressions, `for` and labels are under test.
    groups = copy.deepcopy(rule_groups)
    for g in groups:
        for r in g["rules"]:
            r.pop("annotations", None)
    path.write_text(yaml.safe_dump({"groups": groups}))


@pytest.mark.parametrize("title,series,tests", CASES, ids=[c[0] for c in CASES])
def test_alert_fires_or_stays_silent(chart_tools, rule_groups, tmp_path, title, series, tests):
    _write_rules_without_annotations(rule_groups, tmp_path / "rules.yaml")
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [{"name": title, "interval": "1m", "input_series": series, "alert_rule_test": tests}],
            }
        )
    )
    res = promtool(chart_tools, "test", "rules", "test.yaml", cwd=tmp_path)
    assert res.returncode == 0, f"{title}:\n{res.stdout}\n{res.stderr}"
    assert "SUCCESS" in res.stdout


def test_promtool_test_detects_a_wrong_expectation(chart_tools, rule_groups, tmp_path):
    """Guard: a firing case asserted as silent fails, so the cases above can fail."""
    _write_rules_without_annotations(rule_groups, tmp_path / "rules.yaml")
    title, series, _ = CASES[0]
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [silent("GDNEngineDead", "10m")]}],
            }
        )
    )
    res = promtool(chart_tools, "test", "rules", "test.yaml", cwd=tmp_path)
    assert res.returncode != 0 and "GDNEngineDead" in res.stdout + res.stderr


def test_thresholds_come_from_values(chart_tools):
    objs = docs(
        render_text(
            VALUE_SETS["monitoring"],
            sets={
                "monitoring.prometheusRule.acceptanceCollapse.threshold": 0.35,
                "monitoring.prometheusRule.crashLoop.count": 5,
                "monitoring.prometheusRule.crashLoop.window": "1h",
            },
        )
    )
    rules = {r["alert"]: r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert "< 0.35" in rules["GDNSpecAcceptanceCollapse"]["expr"]
    assert "[1h])) >= 5" in rules["GDNEngineCrashLoop"]["expr"]
    assert "GDNOperatorDown" not in {
        r["alert"]
        for g in one(docs(render_text(sets={"monitoring.prometheusRule.enabled": True})), "PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
    }


# ---- dashboard ------------------------------------------------------------------------------------
GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$namespace": ".*",
    "$model": ".*",
    "$server": ".*",
}


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


@pytest.fixture(scope="module")
def dashboard(chart_tools):
    cm = one(render_set("monitoring"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = cm["data"]
    d = json.loads(cm["data"][key])
    assert d == json.loads(DASHBOARD.read_text())
    return d


def test_dashboard_structure(dashboard):
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    vars_ = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "model", "server"} <= vars_
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = " | ".join(p["title"] for p in _panels(dashboard)).lower()
    for needle in (
        "acceptance rate per server",
        "acceptance rate per pod",
        "mean accepted length per server",
        "mean accepted length per pod",
        "drafts per second",
        "crashes by signature",
        "engine restarts",
        "admission denials",
        "output probes by result",
        "output inconsistent",
        # serving SLOs from vLLM's own metrics (issue 28)
        "time to first token",
        "inter-token latency",
        "end-to-end request latency",
        "requests running / waiting",
        "kv-cache usage",
        "preemptions",
        "request error rate",
        "generation tokens/s",
        "mtp value",
    ):
        assert needle in titles, needle
    for p in _panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()


def _exprs(dashboard) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p.get("targets", [])]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", v["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def _substitute(expr: str) -> str:
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


def test_dashboard_queries_parse_with_promtool(chart_tools, dashboard, tmp_path):
    exprs = _exprs(dashboard)
    rules = [{"record": f"dashboard:q{i}", "expr": _substitute(e)} for i, (_, e) in enumerate(exprs)]
    f = tmp_path / "dashboard-rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = promtool(chart_tools, "check", "rules", str(f))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


def _vllm_metric_names() -> set[str]:
    return {
        line.split("{")[0].split(" ")[0] for line in VLLM_FIXTURE.read_text().splitlines() if line and not line.startswith("#")
    }


def test_every_metric_name_exists(dashboard, rule_groups):
    texts = [e for _, e in _exprs(dashboard)] + [r["expr"] for g in rule_groups for r in g["rules"]]
    used = set()
    for t in texts:
        used |= set(re.findall(r"\b(gdn_[a-z0-9_]+|vllm:[a-z0-9_:]+)", t))
    from gdn_operator import telemetry

    known_gdn = {m.name for m in telemetry.METRICS_REGISTRY.collect()}
    gdn_ok = set()
    for n in known_gdn:
        gdn_ok |= {n, n + "_total", n + "_bucket", n + "_count", n + "_sum"}
    vllm_ok = _vllm_metric_names()
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in vllm_ok
    missing = {u for u in used if (u.startswith("gdn_") and u not in gdn_ok) or (u.startswith("vllm:") and u not in vllm_ok)}
    assert not missing, f"metric names not exported by the operator / vLLM 0.32.0: {missing}"
    assert any(u.startswith("vllm:") for u in used) and any(u.startswith("gdn_") for u in used)


def test_dashboard_acceptance_query_on_real_vllm_counters(chart_tools, dashboard, tmp_path):
    """Evaluate the per-model acceptance and mean-accepted-length panels on series shaped like the
    real vLLM 0.32.0 exposition (same names and labels), with known rates."""
    exprs = dict((t, e) for t, e in _exprs(dashboard))
    acc = _substitute(exprs["Acceptance rate per server"])
    mal = _substitute(exprs["Mean accepted length per server"])
    lbl = 'engine="0",model_name="tiny-qwen3-next",namespace="ml",pod="qwen-0",server="qwen"'
    # per minute: 100 drafts, 200 draft tokens (k=2), 150 accepted -> acceptance 0.75, MAL 2.5
    series = [
        s(f"vllm:spec_decode_num_drafts_total{{{lbl}}}", "0+100x20"),
        s(f"vllm:spec_decode_num_draft_tokens_total{{{lbl}}}", "0+200x20"),
        s(f"vllm:spec_decode_num_accepted_tokens_total{{{lbl}}}", "0+150x20"),
    ]
    rules = {
        "groups": [{"name": "d", "rules": [{"record": "dash:acceptance", "expr": acc}, {"record": "dash:mal", "expr": mal}]}]
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rules))
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["r.yaml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": series,
                        "promql_expr_test": [
                            {
                                "expr": "dash:acceptance",
                                "eval_time": "15m",
                                "exp_samples": [{"labels": 'dash:acceptance{namespace="ml",server="qwen"}', "value": 0.75}],
                            },
                            {
                                "expr": "dash:mal",
                                "eval_time": "15m",
                                "exp_samples": [{"labels": 'dash:mal{namespace="ml",server="qwen"}', "value": 2.5}],
                            },
                        ],
                    }
                ],
            }
        )
    )
    res = promtool(chart_tools, "test", "rules", "t.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
