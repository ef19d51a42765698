#!/usr/bin/env bash
# The main job: a local control plane with simulated GPU nodes, the CRD, the operator (with its
# admission webhook) and the sample GDNModelServer. Ctrl-C stops everything.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash hack/bootstrap.sh
bash tests/cluster/build.sh full
case " $* " in *" --real-engine"*) bash hack/vllm-cpu-env.sh ;; esac  # the engine tier (cached)
exec "$ROOT/.venv/bin/python" hack/dev.py "$@"
