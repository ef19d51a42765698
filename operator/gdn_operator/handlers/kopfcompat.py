"""The parts of kopf the operator uses that kopf does not export: one adapter, so that a kopf release that
moves them breaks here (and in tests/handlers/test_kopfcompat.py), not somewhere in the handlers.

`kopf>=1.40,<2` (pyproject.toml) protects only kopf's public names (`kopf.*`). What we need beyond them:

- the webhook configurations kopf would write for the registered admission handlers (`build_webhooks`,
  the function kopf's own configuration manager calls; `WebhookType`, `WebhookHandler`; the registry's
  webhook handlers): handlers/webhookconfigs.py points the chart's shipped configurations at this operator
  and checks them against exactly what kopf would have written;
- the errors kopf's admission server maps to HTTP statuses (`AmbiguousResourceError`,
  `UnknownResourceError`, `WebhookError`), and `WebhookServer._serve(fn, request)`, the method
  handlers/webhook_limits.py overrides to bound request size and nesting before kopf parses a review.
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
    "webhook_handlers",
]

#: the parameters of kopf.WebhookServer._serve that webhook_limits.BoundedWebhookServer overrides
SERVE_PARAMETERS = ("fn", "request")


def webhook_handlers(registry: kopf.OperatorRegistry) -> list[WebhookHandler]:
    """The admission handlers registered in `registry` (kopf keeps them in a private sub-registry)."""
    return list(registry._webhooks.get_all_handlers())
