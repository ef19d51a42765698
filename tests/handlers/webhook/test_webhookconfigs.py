"""handlers/webhook/configs.py: pointing the chart-shipped webhook configurations at the operator (plan,
retry) and the GDN_WEBHOOK_CONFIGS switch."""

from __future__ import annotations

import asyncio
import copy

import kopf
import pytest

from gdn_operator.handlers import main

from gdn_operator.handlers.webhook import configs as webhookconfigs
from gdn_operator.handlers.webhook.configs import MUTATING, VALIDATING, ConfigurationProblem, plan
from gdn_operator.settings import Settings

CONFIG = "gdn.example.io"


@pytest.fixture
def registry():
    """A kopf registry holding the operator's real admission handlers (GDN_MUTATE_SPEC: both of them)."""
    reg = kopf.OperatorRegistry()
    main.register_admission(reg, mutate_spec=True)
    return reg


def desired(registry, ca: str | None = "Q0E=", namespaces=()):
    cc = webhookconfigs.service_client_config("gdn-webhook", "gdn-system", 443, None, ca)
    return webhookconfigs.desired_webhooks(webhookconfigs.registered_handlers(registry), CONFIG, cc, namespaces)


def live_of(kind: str, hooks: list[dict]) -> dict:
    """A configuration as read back from the API server (the chart's webhooks, no caBundle yet)."""
    out = {"metadata": {"name": CONFIG}, "webhooks": copy.deepcopy(hooks)}
    for h in out["webhooks"]:
        h["clientConfig"].pop("caBundle", None)
        h.setdefault("objectSelector", {})  # API server defaults
        h.setdefault("namespaceSelector", {})
        if kind == MUTATING:
            h.setdefault("reinvocationPolicy", "Never")
    return out


def test_one_webhook_per_handler_named_and_routed_like_kopf(registry):
    d = desired(registry, namespaces=("team-a",))
    assert set(d) == {VALIDATING, MUTATING}
    (v,), (m,) = d[VALIDATING], d[MUTATING]
    assert v["name"] == f"gdn-admission.{CONFIG}" and m["name"] == f"gdn-mitigate.{CONFIG}"
    assert v["clientConfig"] == {
        "service": {"name": "gdn-webhook", "namespace": "gdn-system", "port": 443, "path": "/gdn-admission"},
        "caBundle": "Q0E=",
    }
    assert v["rules"] == [
        {
            "apiGroups": ["serving.gdn-operator.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["gdnmodelservers"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "*",
        }
    ]
    assert v["failurePolicy"] == "Fail" and v["sideEffects"] == "None"
    assert v["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]
    }
    assert "objectSelector" not in v  # kopf's None, left out as a manifest would
    assert "namespaceSelector" not in desired(registry)[VALIDATING][0]  # all namespaces


def test_chart_config_without_ca_gets_only_the_ca_bundle(registry):
    d = desired(registry, namespaces=("team-a",))
    for kind in (VALIDATING, MUTATING):
        p = plan(kind, live_of(kind, d[kind]), d[kind])
        assert p.drift == []
        assert p.patch == [
            {"op": "test", "path": "/webhooks/0/name", "value": d[kind][0]["name"]},
            {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="},
        ]


def test_pointed_config_needs_no_patch(registry):
    d = desired(registry)
    live = live_of(VALIDATING, d[VALIDATING])
    live["webhooks"][0]["clientConfig"]["caBundle"] = "Q0E="
    assert plan(VALIDATING, live, d[VALIDATING]).patch == []


def test_other_target_replaces_the_client_config_at_the_right_index(registry):
    d = desired(registry)
    live = live_of(VALIDATING, d[VALIDATING])
    live["webhooks"].insert(0, {**copy.deepcopy(live["webhooks"][0]), "name": f"other.{CONFIG}"})
    local = {"url": "https://127.0.0.1:9443/gdn-admission", "caBundle": "TE9D"}
    want = [{**d[VALIDATING][0], "clientConfig": local}]
    p = plan(VALIDATING, live, want)
    assert p.patch == [
        {"op": "test", "path": "/webhooks/1/name", "value": f"gdn-admission.{CONFIG}"},
        {"op": "replace", "path": "/webhooks/1/clientConfig", "value": local},
    ]
    assert p.drift == [f"{VALIDATING} {CONFIG}: webhook other.{CONFIG} is not served by this operator"]


def test_drift_in_chart_fields_is_reported_not_patched(registry):
    d = desired(registry, namespaces=("team-a",))
    live = live_of(VALIDATING, d[VALIDATING])
    live["webhooks"][0]["failurePolicy"] = "Ignore"
    live["webhooks"][0]["namespaceSelector"] = {}
    p = plan(VALIDATING, live, d[VALIDATING])
    assert [op["path"] for op in p.patch] == ["/webhooks/0/name", "/webhooks/0/clientConfig/caBundle"]
    assert len(p.drift) == 2
    assert "failurePolicy is 'Ignore', this operator serves 'Fail'" in p.drift[0]
    assert "namespaceSelector" in p.drift[1] and "team-a" in p.drift[1]


def test_missing_webhook_names_the_fix(registry):
    d = desired(registry)
    live = {"metadata": {"name": CONFIG}, "webhooks": [{"name": f"renamed.{CONFIG}", "clientConfig": {}}]}
    with pytest.raises(ConfigurationProblem) as e:
        plan(VALIDATING, live, d[VALIDATING])
    msg = str(e.value)
    assert f"has no webhook gdn-admission.{CONFIG}" in msg and f"renamed.{CONFIG}" in msg and "helm upgrade" in msg


class FakeServer:
    """Yields client configs like kopf's server (a new one when its certificate files change)."""

    def __init__(self, configs):
        self.configs = configs
        self.entered = self.exited = False

    async def __aenter__(self):
        self.entered = True
        return self

    async def __aexit__(self, *exc):
        self.exited = True

    async def __call__(self, fn):
        for c in self.configs:
            yield c
            await asyncio.sleep(0.05)


async def test_shipped_configurations_retry_until_pointed_and_follow_new_certificates(registry, monkeypatch):
    calls: list[str] = []

    def point(api, config_name, desired_):
        ca = desired_[VALIDATING][0]["clientConfig"]["caBundle"]
        calls.append(ca)
        if len(calls) == 1:
            raise ConfigurationProblem("API server away")
        return []

    monkeypatch.setattr(webhookconfigs, "point_webhooks", point)
    monkeypatch.setattr(webhookconfigs, "RETRY_DELAYS", (0.01,))
    first = webhookconfigs.service_client_config("s", "n", 443, None, "Rmlyc3Q=")
    second = webhookconfigs.service_client_config("s", "n", 443, None, "U2Vjb25k")
    inner = FakeServer([first, second])
    wrapped = webhookconfigs.ShippedConfigurations(inner, config_name=CONFIG, registry=registry, api=object())
    yielded = []
    async with wrapped:
        async for cc in wrapped(lambda *a, **k: None):
            yielded.append(cc)
            await asyncio.wait_for(wrapped.published.wait(), 5)
    assert yielded == [first, second], "the wrapper passes kopf every client config unchanged"
    assert calls == ["Rmlyc3Q=", "Rmlyc3Q=", "U2Vjb25k"], "a failure is retried; a new certificate is published"
    assert inner.entered and inner.exited


def test_webhook_configs_mode_from_env():
    service = {"GDN_WEBHOOK_MODE": "service", "GDN_WEBHOOK_SERVICE": "gdn-webhook", "GDN_WEBHOOK_NAMESPACE": "gdn-system"}
    assert Settings.from_env(service).webhook_configs == "shipped"
    assert Settings.from_env({"GDN_WEBHOOK_MODE": "local"}).webhook_configs == "managed"
    assert Settings.from_env({"GDN_WEBHOOK_MODE": "local", "GDN_WEBHOOK_CONFIGS": "shipped"}).webhook_configs == "shipped"
    with pytest.raises(ValueError, match="GDN_WEBHOOK_CONFIGS='create': must be managed .* or shipped"):
        Settings.from_env({**service, "GDN_WEBHOOK_CONFIGS": "create"})


async def test_no_registered_handlers_is_an_error_not_a_silent_success(caplog):
    wrapped = webhookconfigs.ShippedConfigurations(
        FakeServer([]), config_name=CONFIG, registry=kopf.OperatorRegistry(), api=object()
    )
    await wrapped.publish(webhookconfigs.service_client_config("s", "n", 443, None, "Q0E="))
    assert not wrapped.published.is_set()
    assert any(r.levelname == "ERROR" and "no admission handlers" in r.getMessage() for r in caplog.records)
