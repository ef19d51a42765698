"""kopf handlers. `kopf run -m gdn_operator.handlers` (or `python -m gdn_operator`) loads them all."""

from gdn_operator.handlers import acceptance, admission, crashwatch, reconcile, router, startup, workload  # noqa: F401
