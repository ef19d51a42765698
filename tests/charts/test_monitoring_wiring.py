"""Monitoring wiring (issue 28), without a Prometheus: label names, honorLabels/relabeling per monitor,
configurable monitor labels, runbooks, and the dashboard generated with Grafana's typed models.
The live proof (a real Prometheus Operator + Prometheus scraping the operator and a real engine) is
tests/integration/test_monitoring_live.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from _chart_helpers import DASHBOARD, ROOT, VALUE_SETS, docs, one, render_text

RUNBOOKS = ROOT / "docs" / "runbooks"
LIVE_LABELS = {"release": "kps"}


def test_every_gdn_series_names_the_server_server():
    """One label name for the server across every gdn_* metric (`server`; never `name`)."""
    from gdn_operator import telemetry

    seen = 0
    for metric in telemetry.METRICS_REGISTRY.collect():
        labels = set(
            getattr(
                telemetry, next(k for k, v in vars(telemetry).items() if getattr(v, "_name", None) == metric.name)
            )._labelnames
        )
        assert "name" not in labels, f"{metric.name} labels {labels}: the server label is `server`"
        if "namespace" in labels and labels != {"namespace", "decision", "rule"}:
            assert "server" in labels, f"{metric.name}: a per-server series needs `server`"
            seen += 1
    assert seen >= 10


def test_service_monitor_honors_the_operators_labels(chart_tools):
    sm = one(
        docs(render_text(VALUE_SETS["monitoring"], sets={"monitoring.serviceMonitor.labels": LIVE_LABELS})), "ServiceMonitor"
    )
    assert sm["metadata"]["labels"]["release"] == "kps"
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True  # else namespace/pod of the servers become exported_namespace/exported_pod


def test_global_pod_monitor_adds_server_and_does_not_honor_engine_labels(chart_tools):
    pm = one(
        docs(render_text(sets={"monitoring.enginePodMonitor.mode": "global", "monitoring.enginePodMonitor.labels": LIVE_LABELS})),
        "PodMonitor",
    )
    assert pm["metadata"]["labels"]["release"] == "kps"
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert not ep.get("honorLabels")
    assert ep["relabelings"] == [
        {
            "action": "replace",
            "sourceLabels": ["__meta_kubernetes_pod_label_serving_gdn_operator_io_server"],
            "targetLabel": "server",
        }
    ]


def test_per_server_pod_monitor_labels_reach_the_operator(chart_tools):
    """perServer mode: the chart hands monitoring.enginePodMonitor.labels to the operator, which puts them
    on every PodMonitor it creates (settings -> render/engine.pod_monitor)."""
    from gdn_operator.settings import Settings

    dep = one(docs(render_text(sets={"monitoring.enginePodMonitor.labels": LIVE_LABELS})), "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["GDN_POD_MONITOR_LABELS"]) == LIVE_LABELS
    cfg = Settings.from_env({"GDN_POD_MONITOR_LABELS": env["GDN_POD_MONITOR_LABELS"]})
    assert dict(cfg.pod_monitor_labels) == LIVE_LABELS
    default = one(docs(render_text()), "Deployment")
    assert {e["name"]: e.get("value") for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}[
        "GDN_POD_MONITOR_LABELS"
    ] == "{}"


@pytest.mark.parametrize("raw", ["release=kps", "[1]", '{"a": 1}'])
def test_bad_pod_monitor_labels_name_the_variable(raw):
    from gdn_operator.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="GDN_POD_MONITOR_LABELS.*JSON object"):
        Settings.from_env({"GDN_POD_MONITOR_LABELS": raw})


def _rules(sets=None):
    rule = one(docs(render_text(VALUE_SETS["monitoring"], sets=sets)), "PrometheusRule")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_every_alert_has_a_runbook_in_the_repo(chart_tools):
    base = "https://example.com/gdn/runbooks/"
    rules = _rules({"monitoring.prometheusRule.runbookBaseUrl": base})
    assert rules
    for r in rules:
        url = r["annotations"]["runbook_url"]
        assert url == f"{base}{r['alert']}.md", url
        page = RUNBOOKS / f"{r['alert']}.md"
        assert page.is_file(), f"no runbook {page.relative_to(ROOT)} for {r['alert']}"
        text = page.read_text()
        assert text.startswith(f"# {r['alert']}\n")
        for section in ("## Meaning", "## Confirm", "## What the operator already did", "## What to do"):
            assert section in text, f"{page.name}: missing {section!r}"
        assert f"[{r['alert']}]({r['alert']}.md)" in (RUNBOOKS / "README.md").read_text()
    default = _rules()[0]["annotations"]["runbook_url"]
    assert default.startswith("https://github.com/gdn-operator/gdn-operator/blob/main/docs/runbooks/")


def test_alert_for_durations_come_from_values(chart_tools):
    rules = {
        r["alert"]: r
        for r in _rules({"monitoring.prometheusRule.engineDead.for": "30s", "monitoring.prometheusRule.operatorDown.for": "1m"})
    }
    assert rules["GDNEngineDead"]["for"] == "30s" and rules["GDNOperatorDown"]["for"] == "1m"
    assert "for 1m:" in rules["GDNOperatorDown"]["annotations"]["description"]


def test_alerts_group_by_namespace_and_server(chart_tools):
    for r in _rules():
        assert not re.search(r"\bname\b", r["expr"]), f"{r['alert']} groups by `name`: {r['expr']}"
        if r["alert"] not in ("GDNAdmissionDenialsSpike", "GDNOperatorDown"):
            assert "namespace, server" in r["expr"], r["alert"]
            assert "$labels.server" in r["annotations"]["summary"], r["alert"]


# ---- dashboard: generated with grafana-foundation-sdk -------------------------------------------------


def test_dashboard_json_is_generated_by_the_typed_builder():
    res = subprocess.run([sys.executable, str(ROOT / "hack" / "gen_dashboard.py"), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_dashboard_loads_into_grafanas_dashboard_model():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads(DASHBOARD.read_text())
    model = Dashboard.from_json(raw)
    assert model.uid == "gdn-operator-overview" and model.panels
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == raw  # nothing outside Grafana's schema


def test_operator_and_vllm_panels_select_the_same_servers():
    raw = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in raw["panels"] for t in p.get("targets", [])]
    for e in exprs:
        for sel in re.findall(r"(?:gdn_\w+|vllm:\w+)\{([^}]*)\}", e):
            if "namespace" in sel and "gdn_admission_decisions" not in e:  # admission: per namespace, no server yet
                assert 'server=~"$server"' in sel, e
    assert any("vllm:time_to_first_token_seconds_bucket" in e for e in exprs)
    mtp = next(p for p in raw["panels"] if p["title"].startswith("MTP value"))
    got = " ".join(t["expr"] for t in mtp["targets"])
    assert "vllm:generation_tokens_total" in got and "vllm:spec_decode_num_accepted_tokens_total" in got
