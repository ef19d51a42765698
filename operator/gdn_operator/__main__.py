"""`gdn-operator` / `python -m gdn_operator`: run the operator (kopf) with settings from the environment.

Environment: GDN_WATCH_NAMESPACES (comma list; empty = all), GDN_DEFAULT_POLICY (reject|mitigate|warn),
GDN_WEBHOOK_MODE (''|local|service) and friends, GDN_METRICS_PORT, GDN_PEERING (peering name for HA),
GDN_LIVENESS (kopf liveness endpoint, default http://0.0.0.0:8081/healthz). See handlers/config.py.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys


def main() -> int:
    import kopf

    from gdn_operator.handlers.config import get_config

    try:
        cfg = get_config()
    except ValueError as e:
        print(f"gdn-operator: {e}", file=sys.stderr)
        return 2
    import gdn_operator.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=os.environ.get("GDN_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    peering = os.environ.get("GDN_PEERING") or None
    priority_env = os.environ.get("GDN_PEERING_PRIORITY", "0").strip() or "0"
    if priority_env == "auto":
        # kopf pauses every replica that sees a live peer of the same priority: give each replica a
        # distinct random one so exactly one is active.
        priority = secrets.randbelow(1_000_000) + 1
    else:
        try:
            priority = int(priority_env)
        except ValueError:
            print(f"gdn-operator: GDN_PEERING_PRIORITY={priority_env!r}: must be an integer or 'auto'", file=sys.stderr)
            return 2
    kopf.run(
        clusterwide=not cfg.namespaces,
        namespaces=list(cfg.namespaces),
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        liveness_endpoint=os.environ.get("GDN_LIVENESS", "http://0.0.0.0:8081/healthz") or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
