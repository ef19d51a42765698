"""kopf's non-public parts the operator uses, all through handlers/core/kopfcompat.py: each name is still where the
adapter imports it from and still the kind of object the handlers use it as. A kopf release that moves or
changes one fails here (and at the adapter's import), not in a webhook at run time."""

from __future__ import annotations

import ast
import enum
import inspect
from pathlib import Path

import kopf

from gdn_operator.handlers.core import kopfcompat


def test_the_admission_errors_are_exceptions_kopf_raises():
    for err in (kopfcompat.AmbiguousResourceError, kopfcompat.UnknownResourceError, kopfcompat.WebhookError):
        assert inspect.isclass(err) and issubclass(err, Exception), err
    # kopf's own _serve maps exactly these (webhook_limits.BoundedWebhookServer._serve maps them the same way)
    serve = inspect.getsource(kopf.WebhookServer._serve)
    assert all(
        e.__name__ in serve for e in (kopfcompat.AmbiguousResourceError, kopfcompat.UnknownResourceError, kopfcompat.WebhookError)
    )


def test_webhook_server_serve_is_the_static_method_the_bounded_server_overrides():
    from gdn_operator.handlers.webhook.limits import BoundedWebhookServer

    assert isinstance(inspect.getattr_static(kopf.WebhookServer, "_serve"), staticmethod)
    assert tuple(inspect.signature(kopf.WebhookServer._serve).parameters) == kopfcompat.SERVE_PARAMETERS
    # an instance method here (it reads the server's routes): kopf calls it as self._serve(fn, request)
    assert tuple(inspect.signature(BoundedWebhookServer._serve).parameters)[1:] == kopfcompat.SERVE_PARAMETERS
    assert "self._serve(fn, request)" in inspect.getsource(kopf.WebhookServer.__call__)


def test_webhook_types_and_handlers_are_what_webhookconfigs_reads():
    assert issubclass(kopfcompat.WebhookType, enum.Enum)
    assert {kopfcompat.WebhookType.VALIDATING, kopfcompat.WebhookType.MUTATING} <= set(kopfcompat.WebhookType)
    registry = kopf.OperatorRegistry()

    @kopf.on.validate("serving.gdn-operator.io", "v1alpha1", "gdnmodelservers", id="probe-handler", registry=registry)
    def check(**_):
        pass

    (handler,) = kopfcompat.webhook_handlers(registry)
    assert isinstance(handler, kopfcompat.WebhookHandler)
    assert handler.reason == kopfcompat.WebhookType.VALIDATING and handler.id == "probe-handler"


def test_build_webhooks_takes_the_arguments_webhookconfigs_passes():
    params = inspect.signature(kopfcompat.build_webhooks).parameters
    assert {"resources", "name_suffix", "client_config"} <= set(params)
    registry = kopf.OperatorRegistry()
    kopf.on.mutate("serving.gdn-operator.io", "v1alpha1", "gdnmodelservers", id="m", registry=registry)(lambda **_: None)
    hooks = kopfcompat.build_webhooks(
        kopfcompat.webhook_handlers(registry),
        resources=[kopf.Resource("serving.gdn-operator.io", "v1alpha1", "gdnmodelservers", namespaced=True)],
        name_suffix="gdn",
        client_config=kopf.WebhookClientConfig(url="https://x/"),
    )
    assert len(hooks) == 1 and hooks[0]["clientConfig"]["url"].startswith("https://x/") and hooks[0]["rules"]


def test_only_the_adapter_imports_kopf_internals():
    pkg = Path(kopfcompat.__file__).resolve().parents[2]
    found = []
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(pkg)}: {n}" for n in names if n.startswith("kopf._")]
    assert found and all(f.startswith("handlers/core/kopfcompat.py: ") for f in found), found
