"""`gdn-operator` / `python -m gdn_operator`: run the operator (kopf) with settings from the environment.

Every `GDN_*` variable is parsed once, here, into gdn_operator.settings.Settings (the table of them all is
in charts/gdn-operator/README.md); a bad value stops the operator with the variable and the fix named.
The startup handler (handlers/main.py) builds the runtime from the same object.
"""

from __future__ import annotations

import sys

import kopf

from gdn_operator.handlers.core.heap import settle_heap
from gdn_operator.handlers.main import SETTINGS_MEMO_KEY  # importing it registers every kopf handler
from gdn_operator.settings import process_settings


def main() -> int:
    cfg = process_settings("gdn-operator")
    if cfg is None:
        return 2
    settle_heap()  # the operator process only (not tests that import the handlers): imports and rules out of the GC
    kopf.run(
        clusterwide=not cfg.namespaces,
        namespaces=list(cfg.namespaces),
        standalone=cfg.peering is None,
        peering_name=cfg.peering,
        priority=cfg.resolved_priority(),
        liveness_endpoint=cfg.liveness,
        memo=kopf.Memo({SETTINGS_MEMO_KEY: cfg}),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
