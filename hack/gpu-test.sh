#!/usr/bin/env bash
# The GPU tier (tests/gpu, marker `gpu`): run on a host with an NVIDIA GPU and the offline vLLM bundle
# installed by hack/gpu/install.sh.  Never part of hack/test.sh / CI.
#   hack/gpu-test.sh [--site DIR] [--artifacts DIR] [--model DIR] [pytest args...]
# --site       the installed bundle (default: ${GDN_CACHE_DIR:-~/.cache/gdn-operator}/gpu-site/vllm-0.22.0)
# --artifacts  where engine logs, /metrics captures and gpu-results.json are copied (flat, <= 6 files;
#              default: $GDN_GPU_ARTIFACTS if set, else .gpu-artifacts/)
# --model      the trained tiny model (default: tests/models/tiny-qwen3-next-recall)
# Uses the host's python3 (it has torch and pytest) with PYTHONPATH=<site>:operator — the project's own
# package imports from there without installing anything (pydantic comes from the bundle).
# Budget: one cold engine start (~4 min, Triton JIT; all engines start at once) + ~2 min of tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SITE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}/gpu-site/vllm-0.22.0"
ART="${GDN_GPU_ARTIFACTS:-$ROOT/.gpu-artifacts}"
PYARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --site) SITE="$2"; shift 2 ;;
    --artifacts) ART="$2"; shift 2 ;;
    --model) export GDN_GPU_MODEL="$2"; shift 2 ;;
    *) PYARGS+=("$1"); shift ;;
  esac
done
[ -d "$SITE/vllm" ] || { echo "gpu-test: $SITE has no vllm (install the bundle: hack/gpu/install.sh BUNDLE_DIR $SITE)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
mkdir -p "$ART"
export GDN_GPU_TEST=1 GDN_GPU_SITE="$SITE" GDN_GPU_ARTIFACTS="$ART"
export PYTHONPATH="$SITE:$ROOT/operator" PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
t0=$(date +%s)
set +e
python3 -m pytest -p no:cacheprovider --confcutdir=tests/gpu -o addopts= -rA -v tests/gpu "${PYARGS[@]}"
rc=$?
set -e
echo "gpu-test: rc=$rc in $(( $(date +%s) - t0 ))s; artifacts in $ART: $(ls "$ART" | tr '\n' ' ')"
exit $rc
