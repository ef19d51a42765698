"""Admission webhook configurations shipped by the Helm chart; the operator only points them at itself.

Two ways to get the Validating/MutatingWebhookConfiguration objects (GDN_WEBHOOK_CONFIGS):

* ``managed`` (dev and local tests, admin credentials): kopf creates both objects named
  GDN_WEBHOOK_CONFIG_NAME and rewrites their whole ``webhooks`` list (``settings.admission.managed``).
  kopf's configuration manager tries ``create`` first, and ``create`` cannot be limited by name in
  RBAC, so this mode needs the right to create webhook configurations of ANY name.
* ``shipped`` (the chart; the default in service mode): the chart installs both objects with their
  complete webhooks (names, rules, failurePolicy, sideEffects, a namespaceSelector that follows
  ``operator.watchNamespaces``). The operator reads them (``get``) and patches only each webhook's
  ``clientConfig`` -- in practice the caBundle of its CA -- with a JSON patch (``patch``), both limited
  to the two names by ``resourceNames``. Rules, selectors and policies stay the chart's: where they
  differ from what this operator serves (:func:`desired_webhooks`, kopf's own construction from our
  registered handlers), it logs a warning instead of overwriting them.

``tests/charts/test_chart_webhooks.py`` holds the chart's rendered webhooks to :func:`desired_webhooks`
so the two cannot drift; ``tests/integration/test_rbac_sar.py`` runs :func:`point_webhooks` with the
chart's RBAC only.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers.core.kopfcompat import WebhookHandler, WebhookType, build_webhooks, webhook_handlers
from gdn_operator.handlers.core.kube import Retry, _json, api_client, retrying

log = logging.getLogger(__name__)

VALIDATING = "ValidatingWebhookConfiguration"
MUTATING = "MutatingWebhookConfiguration"
_KIND_OF_REASON = {WebhookType.VALIDATING: VALIDATING, WebhookType.MUTATING: MUTATING}
#: label the chart's namespaceSelector matches (set by the API server on every namespace)
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
#: webhook fields the chart owns; compared with what this operator serves, never overwritten
CHART_FIELDS = (
    "rules",
    "failurePolicy",
    "sideEffects",
    "matchPolicy",
    "timeoutSeconds",
    "admissionReviewVersions",
    "objectSelector",
    "namespaceSelector",
)
#: How long the API server waits for an admission answer (kopf writes 30, the maximum, in managed mode): with
#: failurePolicy Fail, every GDNModelServer write waits this long when the operator does not answer, and
#: admission answers in milliseconds (rules evaluated in memory). The chart ships this value (issue 38).
WEBHOOK_TIMEOUT_SECONDS = 10
#: seconds between attempts while the configurations cannot be pointed at this operator
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class ConfigurationProblem(RuntimeError):
    """The shipped configuration cannot be pointed at this operator (message names the fix)."""


def service_client_config(
    name: str, namespace: str, port: int, path: str | None, ca_bundle: str | None = None
) -> kopf.WebhookClientConfig:
    """The clientConfig of a webhook served behind a Service (before kopf appends the handler id)."""
    out = kopf.WebhookClientConfig(
        service=kopf.WebhookClientConfigService(name=name, namespace=namespace, port=port, path=(path or "").rstrip("/"))
    )
    if ca_bundle is not None:
        out["caBundle"] = ca_bundle
    return out


def namespace_selector(namespaces: Collection[str]) -> dict[str, Any] | None:
    """The webhooks' namespaceSelector: only the watched namespaces (None = every namespace)."""
    if not namespaces:
        return None
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "In", "values": list(namespaces)}]}


def registered_handlers(registry: kopf.OperatorRegistry | None = None) -> list[WebhookHandler]:
    """The admission handlers registered with kopf (the default registry unless one is given)."""
    reg = registry if registry is not None else kopf.get_default_registry()
    return webhook_handlers(reg)


def desired_webhooks(
    handlers: Iterable[WebhookHandler],
    config_name: str,
    client_config: kopf.WebhookClientConfig,
    namespaces: Collection[str] = (),
) -> dict[str, list[dict[str, Any]]]:
    """Kind -> the webhooks kopf would write for `handlers` (its own build_webhooks, the same function its
    configuration manager uses) with our timeout (WEBHOOK_TIMEOUT_SECONDS), plus the namespaceSelector of the
    watch scope; None-valued fields
    dropped, as a manifest would leave them out."""
    resource = kopf.Resource(GROUP, VERSION, PLURAL, namespaced=True)
    selector = namespace_selector(namespaces)
    out: dict[str, list[dict[str, Any]]] = {}
    for reason, kind in _KIND_OF_REASON.items():
        of_kind = [h for h in handlers if h.reason == reason]
        if not of_kind:
            continue
        hooks = build_webhooks(of_kind, resources=[resource], name_suffix=config_name, client_config=client_config)
        for hook in hooks:
            hook["timeoutSeconds"] = WEBHOOK_TIMEOUT_SECONDS
            if selector is not None:
                hook["namespaceSelector"] = copy.deepcopy(selector)
        out[kind] = [{k: v for k, v in hook.items() if v is not None} for hook in hooks]
    return out


def describe(client_config: kopf.WebhookClientConfig | dict[str, Any]) -> str:
    svc = client_config.get("service")
    target = f"service {svc.get('namespace')}/{svc.get('name')}:{svc.get('port', 443)}" if svc else str(client_config.get("url"))
    ca = client_config.get("caBundle")
    return f"{target} (caBundle sha256 {hashlib.sha256(str(ca).encode()).hexdigest()[:12]})" if ca else f"{target} (no caBundle)"


@dataclass
class Plan:
    """What pointing one configuration at this operator takes."""

    patch: list[dict[str, Any]] = field(default_factory=list)  # JSON patch; empty = already pointed
    drift: list[str] = field(default_factory=list)  # chart fields that differ from what we serve


def _normalized(field_name: str, value: Any) -> Any:
    return {} if value is None and field_name in ("objectSelector", "namespaceSelector") else value


def plan(kind: str, live: dict[str, Any], desired: list[dict[str, Any]]) -> Plan:
    """The JSON patch that sets each desired webhook's clientConfig in `live` (a `test` of the webhook's
    name guards every index against a concurrent reorder), and the chart-owned fields that differ.

    Raises ConfigurationProblem when a desired webhook is missing from the configuration."""
    name = (live.get("metadata") or {}).get("name")
    hooks = live.get("webhooks") or []
    index = {h.get("name"): i for i, h in enumerate(hooks)}
    missing = [d["name"] for d in desired if d["name"] not in index]
    if missing:
        raise ConfigurationProblem(
            f"{kind} {name} has no webhook {', '.join(missing)} (it has: {', '.join(map(str, index)) or 'none'}): "
            "the chart's templates/webhook.yaml and this operator's admission handlers disagree; install the "
            "chart version that matches the operator image (helm upgrade)"
        )
    out = Plan()
    wanted = {d["name"] for d in desired}
    out.drift += [f"{kind} {name}: webhook {n} is not served by this operator" for n in index if n not in wanted]
    for d in desired:
        i = index[d["name"]]
        have = hooks[i]
        for f in CHART_FIELDS:
            if _normalized(f, have.get(f)) != _normalized(f, d.get(f)):
                out.drift.append(f"{kind} {name}: webhook {d['name']} {f} is {have.get(f)!r}, this operator serves {d.get(f)!r}")
        have_cc, want_cc = have.get("clientConfig") or {}, d["clientConfig"]
        if have_cc == want_cc:
            continue
        out.patch.append({"op": "test", "path": f"/webhooks/{i}/name", "value": d["name"]})
        same_target = {k: v for k, v in have_cc.items() if k != "caBundle"} == {
            k: v for k, v in want_cc.items() if k != "caBundle"
        }
        if same_target and "caBundle" in want_cc:
            out.patch.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want_cc["caBundle"]})
        else:
            out.patch.append({"op": "replace", "path": f"/webhooks/{i}/clientConfig", "value": want_cc})
    return out


def _read(adm: kubernetes.client.AdmissionregistrationV1Api, kind: str, name: str) -> dict[str, Any]:
    read = adm.read_validating_webhook_configuration if kind == VALIDATING else adm.read_mutating_webhook_configuration
    try:
        return dict(_json(read(name, _preload_content=False)))
    except ApiException as e:
        if e.status == 404:
            raise ConfigurationProblem(
                f"{kind} {name} does not exist: the chart installs it (webhook.enabled=true, webhook.configName="
                f"{name}); outside the chart set GDN_WEBHOOK_CONFIGS=managed to let the operator create it "
                "(needs create on webhook configurations)"
            ) from None
        if e.status == 403:
            raise ConfigurationProblem(
                f"not allowed to read {kind} {name}: the operator needs get and patch on it by name "
                "(the chart's ClusterRole grants them for webhook.configName)"
            ) from None
        raise


def point_webhooks(api: kubernetes.client.ApiClient, config_name: str, desired: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Point every desired webhook of the shipped configurations at this operator (clientConfig only).
    Returns the drift found (for the caller to log). Blocking: run it in a thread."""
    adm = kubernetes.client.AdmissionregistrationV1Api(api)
    drift: list[str] = []
    for kind, hooks in desired.items():
        drift += retrying(functools.partial(_point, adm, kind, config_name, hooks), 5)
    return drift


def _point(
    adm: kubernetes.client.AdmissionregistrationV1Api, kind: str, config_name: str, hooks: list[dict[str, Any]], attempt: int
) -> list[str]:
    """One attempt of point_webhooks for one configuration: read, plan, patch. Returns the drift found."""
    patch = adm.patch_validating_webhook_configuration if kind == VALIDATING else adm.patch_mutating_webhook_configuration
    p = plan(kind, _read(adm, kind, config_name), hooks)
    if not p.patch:
        log.debug("%s %s already points at %s", kind, config_name, describe(hooks[0]["clientConfig"]))
        return p.drift
    try:
        _json(patch(config_name, p.patch, _content_type="application/json-patch+json", _preload_content=False))
    except ApiException as e:
        if e.status in (409, 422):  # a `test` failed: changed under us, plan again
            raise Retry(e) from e
        if e.status == 403:
            raise ConfigurationProblem(
                f"not allowed to patch {kind} {config_name}: the operator needs patch on it by name "
                "(the chart's ClusterRole grants it for webhook.configName)"
            ) from None
        raise
    log.info(
        "pointed %s %s (%s) at %s", kind, config_name, ", ".join(h["name"] for h in hooks), describe(hooks[0]["clientConfig"])
    )
    return p.drift


class ShippedConfigurations:
    """Wraps a kopf webhook server: every client config it yields (at start, and again whenever its
    certificate files change) is written into the shipped configurations' clientConfigs, retried with
    backoff until it lands. Used instead of kopf's ``settings.admission.managed``."""

    def __init__(
        self,
        server: kopf.WebhookServerProtocol,
        *,
        config_name: str,
        namespaces: Collection[str] = (),
        registry: kopf.OperatorRegistry | None = None,
        api: kubernetes.client.ApiClient | None = None,
    ):
        self.server = server
        self.config_name = config_name
        self.namespaces = tuple(namespaces)
        self.registry = registry
        self.api = api
        self.published = asyncio.Event()  # set once the latest client config is in place
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ShippedConfigurations:
        if hasattr(self.server, "__aenter__"):
            await self.server.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._cancel()
        if hasattr(self.server, "__aexit__"):
            await self.server.__aexit__(*exc)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        try:
            async for client_config in self.server(fn):
                self._cancel()
                self.published.clear()
                self._task = asyncio.get_running_loop().create_task(self.publish(client_config))
                yield client_config
        finally:
            self._cancel()

    async def publish(self, client_config: kopf.WebhookClientConfig) -> None:
        desired = desired_webhooks(registered_handlers(self.registry), self.config_name, client_config, self.namespaces)
        if not desired:  # handlers registered elsewhere than the registry given (or kopf's default)
            log.error(
                "no admission handlers in the kopf registry: webhook configurations %s not pointed at this "
                "operator; pass ShippedConfigurations the registry the handlers are registered in",
                self.config_name,
            )
            return
        attempt = 0
        while True:
            try:
                if self.api is None:
                    self.api = api_client()
                drift = await asyncio.to_thread(point_webhooks, self.api, self.config_name, desired)
                break
            except Exception as e:  # noqa: BLE001 - API down, RBAC, a chart that lacks a webhook: retry
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                log.warning(
                    "webhook configurations %s not pointed at this operator yet: %s; retrying in %.0fs",
                    self.config_name,
                    e,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)
        for line in drift:
            log.warning("webhook configuration drift (the chart's values stay in force): %s", line)
        self.published.set()
