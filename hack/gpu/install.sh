#!/usr/bin/env bash
# Install an offline vLLM bundle on an air-gapped GPU host (hack/gpu/README.md).
#   hack/gpu/install.sh BUNDLE_DIR TARGET_DIR [--python python3] [--accept FILE|''] [--check-only]
# BUNDLE_DIR holds manifest.json and every piece (hack/gpu/stage-piece.sh collects them there);
# --check-only needs only manifest.json (run it as soon as the first piece has arrived).
# Verifies each piece and the whole (sha256), checks the bundle's requirements against the live base
# (`python3 -m pip list`), refuses version conflicts not in hack/gpu/accept-conflicts.yaml (exit 3),
# then unpacks into TARGET_DIR.  Afterwards: PYTHONPATH=TARGET_DIR python3 -m vllm.entrypoints.openai.api_server …
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 2 ] || { sed -n 2,8p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
PY=python3
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do [ "${args[$i]}" = --python ] && PY="${args[$((i + 1))]}"; done
PYTHONPATH="" exec "$PY" "$HERE/install.py" "$@"
