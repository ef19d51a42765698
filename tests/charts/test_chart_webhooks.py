"""The chart's webhook configurations (real `helm template`) against what the operator serves.

The chart ships both configurations complete and the operator only patches their caBundle
(handlers/webhook/configs.py), so every webhook the chart renders must be exactly what kopf builds from
the operator's registered admission handlers, pointed at the client config the operator's real webhook
server (handlers/startup.webhook_server, run with the chart's environment) yields, with a
namespaceSelector that follows operator.watchNamespaces.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import kopf
import pytest

from _chart_helpers import VALUE_SETS, by_kind, docs, env_of, one, render_set, render_text
from gdn_operator.handlers.webhook import certs
from gdn_operator.handlers import main
from gdn_operator.handlers import startup
from gdn_operator.handlers.webhook import configs as webhookconfigs
from gdn_operator.settings import Settings

KINDS = (webhookconfigs.VALIDATING, webhookconfigs.MUTATING)


def registered(mutate_spec: bool) -> list:
    """The operator's admission handlers, registered the way the operator registers them."""
    reg = kopf.OperatorRegistry()
    main.register_admission(reg, mutate_spec=mutate_spec)
    return webhookconfigs.registered_handlers(reg)


@pytest.fixture(scope="module")
def handlers():
    """... with GDN_MUTATE_SPEC: both webhooks."""
    hs = registered(mutate_spec=True)
    assert {h.id for h in hs} == {"gdn-admission", "gdn-mitigate"}
    return hs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def served_client_config(objs: list[dict], monkeypatch, tmp_path: Path) -> tuple[Settings, dict]:
    """Start the operator's webhook server with the chart's env; return its config and the client
    config it yields (what the operator writes into the webhook configurations)."""
    env = {k: v for k, v in env_of(objs).items() if isinstance(v, str)}
    for k in [k for k in os.environ if k.startswith("GDN_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GDN_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("GDN_WEBHOOK_PORT", str(_free_port()))  # the chart's 9443 may be taken here
    if "GDN_WEBHOOK_CERT_DIR" in env:  # cert-manager's mounted Secret
        certs.new_bundle(["localhost"]).write(tmp_path)
        monkeypatch.setenv("GDN_WEBHOOK_CERT_DIR", str(tmp_path))
    asked: list[tuple] = []

    def secret_bundle(ns, secret, sans):  # the self-signed path without an API server
        asked.append((ns, secret))
        return certs.new_bundle(sans)

    monkeypatch.setattr(certs, "ensure_secret_bundle", secret_bundle)
    cfg = Settings.from_env()
    server = startup.webhook_server(cfg, {})
    assert server is not None
    async with server:
        gen = server(lambda *a, **k: None)
        client_config = await gen.__anext__()
        await gen.aclose()
    if "GDN_WEBHOOK_SECRET" in env:
        assert asked == [(env["GDN_WEBHOOK_NAMESPACE"], env["GDN_WEBHOOK_SECRET"])]
    return cfg, dict(client_config)


@pytest.mark.parametrize("name", [*sorted(VALUE_SETS), "mutate-spec"])
async def test_chart_webhooks_are_what_the_operator_serves(chart_tools, name, monkeypatch, tmp_path):
    objs = docs(render_text(sets={"operator.mutateSpec": True})) if name == "mutate-spec" else render_set(name)
    cfg, served = await served_client_config(objs, monkeypatch, tmp_path)
    assert cfg.webhook_mode == "service" and cfg.webhook_configs == "shipped"
    assert cfg.mutate_spec == (name == "mutate-spec")
    assert served["caBundle"], "the server publishes its CA"
    handlers = registered(cfg.mutate_spec)
    target = {k: v for k, v in served.items() if k != "caBundle"}
    want = webhookconfigs.desired_webhooks(handlers, cfg.webhook_config_name, target, cfg.namespaces)
    with_ca = webhookconfigs.desired_webhooks(handlers, cfg.webhook_config_name, served, cfg.namespaces)
    # the MutatingWebhookConfiguration exactly when the operator serves a mutating webhook (GDN_MUTATE_SPEC)
    assert {k for k in KINDS if by_kind(objs, k)} == set(want) == ({*KINDS} if cfg.mutate_spec else {webhookconfigs.VALIDATING})
    for kind in want:
        shipped = one(objs, kind, cfg.webhook_config_name)
        assert shipped["webhooks"] == want[kind], f"{kind}: the chart's webhooks differ from what the operator serves"
        # ... so the operator, pointing them at itself, writes the caBundle and nothing else
        p = webhookconfigs.plan(kind, shipped, with_ca[kind])
        assert p.drift == []
        assert [op["op"] for op in p.patch] == ["test", "add"] and p.patch[1]["path"].endswith("/clientConfig/caBundle")


def test_namespace_selector_follows_watch_namespaces(chart_tools):
    cluster = docs(render_text(sets={"operator.mutateSpec": True}))
    for kind in KINDS:
        assert all("namespaceSelector" not in h for h in one(cluster, kind, "gdn-operator.serving.gdn-operator.io")["webhooks"])
    namespaced = docs(render_text(VALUE_SETS["namespaced"], sets={"operator.mutateSpec": True}))
    watched = env_of(namespaced)["GDN_WATCH_NAMESPACES"].split(",")
    assert watched == ["team-a", "team-b"]
    for kind in KINDS:
        for h in one(namespaced, kind, "gdn-operator.serving.gdn-operator.io")["webhooks"]:
            assert h["namespaceSelector"] == {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": watched}]
            }


def test_config_name_and_release_namespace_propagate(chart_tools):
    objs = docs(
        render_text(sets={"webhook.configName": "hooks.example.com", "operator.mutateSpec": True}, namespace="ops", release="r1")
    )
    env = env_of(objs)
    for kind in KINDS:
        cfg = one(objs, kind, "hooks.example.com")
        for h in cfg["webhooks"]:
            assert h["name"].endswith(".hooks.example.com")
            assert h["clientConfig"]["service"]["name"] == env["GDN_WEBHOOK_SERVICE"]
            assert h["clientConfig"]["service"]["namespace"] == "ops"
    rules = [r for r in one(objs, "ClusterRole")["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
    assert rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
            "resourceNames": ["hooks.example.com"],
            "verbs": ["get", "patch"],
        },
        {  # GDNGuard admission: the operator sets the webhooks of its guard configuration, by name only
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["guards.hooks.example.com"],
            "verbs": ["get", "patch"],
        },
    ]
    guards = one(objs, webhookconfigs.VALIDATING, "guards.hooks.example.com")
    assert guards["webhooks"] == []  # shipped empty: the operator adds one webhook per GDNGuard


def test_webhook_disabled_ships_no_configurations_and_no_webhook_rbac(chart_tools):
    objs = docs(render_text(sets={"webhook.enabled": False}))
    for kind in KINDS:
        assert not by_kind(objs, kind)
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for r in role["rules"]:
            assert "admissionregistration.k8s.io" not in r["apiGroups"]
    assert "GDN_WEBHOOK_MODE" not in env_of(objs)


def test_a_changed_handler_is_caught(chart_tools, handlers):
    """Guard: the comparison sees a handler change (here: DELETE added to the validating handler)."""
    objs = docs(render_text(sets={"operator.mutateSpec": True}))
    env = env_of(objs)
    changed = [
        dataclasses.replace(h, operations=["CREATE", "UPDATE", "DELETE"]) if h.id == "gdn-admission" else h for h in handlers
    ]
    target = one(objs, webhookconfigs.VALIDATING, "gdn-operator.serving.gdn-operator.io")["webhooks"][0]["clientConfig"]
    target = {"service": {**target["service"], "path": ""}}
    want = webhookconfigs.desired_webhooks(changed, env["GDN_WEBHOOK_CONFIG_NAME"], target)
    assert (
        one(objs, webhookconfigs.VALIDATING, "gdn-operator.serving.gdn-operator.io")["webhooks"]
        != want[webhookconfigs.VALIDATING]
    )
    assert one(objs, webhookconfigs.MUTATING)["webhooks"] == want[webhookconfigs.MUTATING]
