"""Operator settings: every GDN_* variable parsed once, validated with the variable and the fix named, and
documented in one table that matches the chart's deployment template."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from gdn_operator.settings import Settings, SettingsError, env_names, settings_table

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gdn-operator"


def test_defaults_when_nothing_is_set():
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.default_policy, s.namespaces, s.webhook_mode, s.metrics_port) == ("reject", (), "", 8080)
    assert s.liveness == "http://0.0.0.0:8081/healthz" and s.resolved_priority() == 0


def test_values_are_parsed():
    s = Settings.from_env(
        {
            "GDN_WATCH_NAMESPACES": " a, b ,,",
            "GDN_DEFAULT_POLICY": "warn",
            "GDN_STREAM_LOGS": "off",
            "GDN_CRASH_QUIET_SECONDS": "0.5",
            "GDN_LOG_LEVEL": "debug",
            "GDN_LIVENESS": "",
            "GDN_PEERING": "gdn",
            "GDN_WEBHOOK_MODE": "service",
            "GDN_WEBHOOK_SERVICE": "hook",
            "POD_NAMESPACE": "gdn-system",
        }
    )
    assert s.namespaces == ("a", "b") and s.default_policy == "warn" and s.stream_logs is False
    assert s.crash_quiet_seconds == 0.5 and s.log_level == "DEBUG"
    assert s.liveness is None  # empty: liveness endpoint off
    assert s.peering == "gdn" and s.webhook_namespace == "gdn-system"  # falls back to the pod's namespace
    assert Settings.from_env({"GDN_DEFAULT_POLICY": ""}).default_policy == "reject"  # empty: the default


def test_auto_priority_differs_per_replica():
    s = Settings.from_env({"GDN_PEERING_PRIORITY": "auto"})
    assert len({s.resolved_priority() for _ in range(20)}) > 1
    assert Settings.from_env({"GDN_PEERING_PRIORITY": "7"}).resolved_priority() == 7


@pytest.mark.parametrize(
    "name, value, fix",
    [
        ("GDN_DEFAULT_POLICY", "allow", "set one of reject, mitigate, warn"),
        ("GDN_WEBHOOK_MODE", "remote", "set one of '' (empty), local, service"),
        ("GDN_STREAM_LOGS", "maybe", "set true or false"),
        ("GDN_METRICS_PORT", "80a", "not an integer"),
        ("GDN_WEBHOOK_PORT", "0", "between 1 and 65535"),
        ("GDN_MAX_WORKERS", "0", ">= 1"),
        ("GDN_CRASH_QUIET_SECONDS", "-5", "positive number of seconds"),
        ("GDN_ACCEPTANCE_WINDOW", "soon", "set seconds"),
        ("GDN_PEERING_PRIORITY", "high", "an integer or 'auto'"),
        ("GDN_LOG_LEVEL", "LOUD", "set one of DEBUG"),
    ],
)
def test_bad_values_name_the_variable_and_the_fix(name, value, fix):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({name: value})
    assert str(e.value).startswith(f"{name}={value!r}") and fix in str(e.value)


def test_service_webhook_needs_its_service_and_namespace():
    with pytest.raises(SettingsError, match="GDN_WEBHOOK_MODE=service needs GDN_WEBHOOK_SERVICE and GDN_WEBHOOK_NAMESPACE"):
        Settings.from_env({"GDN_WEBHOOK_MODE": "service", "GDN_WEBHOOK_NAMESPACE": "ns"})


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().default_policy = "warn"  # type: ignore[misc]


def test_the_operator_process_refuses_a_bad_value_before_starting():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "operator"), "GDN_DEFAULT_POLICY": "allow"}
    r = subprocess.run([sys.executable, "-m", "gdn_operator"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "GDN_DEFAULT_POLICY='allow'" in r.stderr and "set one of reject, mitigate, warn" in r.stderr


def test_only_the_settings_module_reads_the_environment():
    hits = []
    for path in (ROOT / "operator" / "gdn_operator").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ|getenv\(", line):
                hits.append(f"{path.relative_to(ROOT)}:{i}")
    assert hits and all(h.startswith("operator/gdn_operator/settings.py:") for h in hits), hits


def _documented_rows() -> list[tuple[str, str, str, str]]:
    text = (CHART / "README.md").read_text()
    block = text.split("<!-- settings-table")[1].split("<!-- /settings-table -->")[0]
    rows = []
    for line in block.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[1].strip("`"), "" if cells[2] == "—" else cells[2].strip("`"), cells[3]))
    return rows


def test_the_chart_readme_documents_every_setting_with_its_default():
    assert _documented_rows() == settings_table()
    assert len(settings_table()) == len(fields(Settings))


def test_the_deployment_template_sets_exactly_the_settings_with_a_chart_value():
    template = (CHART / "templates" / "deployment.yaml").read_text()
    in_template = set(re.findall(r"- name: (GDN_[A-Z_]+)", template))
    assert in_template <= env_names(), in_template - env_names()
    assert in_template == {env for env, _, chart, _ in settings_table() if chart}


def test_every_chart_value_named_exists_in_values_yaml():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for env, _, chart, _ in settings_table():
        node = values
        for part in filter(None, chart.split(".")):
            assert isinstance(node, dict) and part in node, f"{env}: chart value {chart} not in values.yaml"
            node = node[part]
