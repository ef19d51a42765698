"""The parts of kopf the operator uses that kopf does not export: one adapter, so that a kopf release that
moves them breaks here (and in tests/handlers/core/test_kopfcompat.py), not somewhere in the handlers.

`kopf>=1.40,<2` (pyproject.toml) protects only kopf's public names (`kopf.*`). What we need beyond them:

- the webhook configurations kopf would write for the registered admission handlers (`build_webhooks`,
  the function kopf's own configuration manager calls; `WebhookType`, `WebhookHandler`; the registry's
  webhook handlers): handlers/webhook/configs.py points the chart's shipped configurations at this operator
  and checks them against exactly what kopf would have written;
- the resources that have changing (create/update/delete/resume) or spawning (daemon/timer) handlers, from
  the registry's private sub-registries (`essence_resources`): only for those does kopf read the essence it
  builds of every event's body (reconcile.HandledSpecs builds none for the others);
- the errors kopf's admission server maps to HTTP statuses (`AmbiguousResourceError`,
  `UnknownResourceError`, `WebhookError`), and `WebhookServer._serve(fn, request)`, the method
  handlers/webhook/limits.py overrides to bound request size and nesting before kopf parses a review.
"""

from __future__ import annotations

import kopf
from kopf._core.engines.admission import AmbiguousResourceError, UnknownResourceError, WebhookError, build_webhooks
from kopf._core.intents.causes import WebhookType
from kopf._core.intents.handlers import WebhookHandler

__all__ = [
    "AmbiguousResourceError",
    "UnknownResourceError",
    "WebhookError",
    "WebhookHandler",
    "WebhookType",
    "build_webhooks",
    "essence_resources",
    "webhook_handlers",
]

#: the parameters of kopf.WebhookServer._serve that webhook/limits.BoundedWebhookServer overrides
SERVE_PARAMETERS = ("fn", "request")


def webhook_handlers(registry: kopf.OperatorRegistry) -> list[WebhookHandler]:
    """The admission handlers registered in `registry` (kopf keeps them in a private sub-registry)."""
    return list(registry._webhooks.get_all_handlers())


def essence_resources(registry: kopf.OperatorRegistry) -> set[tuple[str | None, str | None]]:
    """(group, name) of the resources whose events kopf diffs against the last essence handled: those its changing
    and spawning handlers select (the name as the handler gave it, a plural or a kind; None where a handler selects
    otherwise: by category, any resource). For every other resource kopf builds the essence and hands it to no
    handler (a watching cause takes no old, new or diff)."""
    out: set[tuple[str | None, str | None]] = set()
    for h in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]:
        name = (h.selector.plural or h.selector.any_name) if h.selector is not None else None
        out.add((h.selector.group if h.selector is not None else None, name if isinstance(name, str) else None))
    return out
