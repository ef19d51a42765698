#!/usr/bin/env bash
# Build an offline vLLM bundle for an air-gapped GPU host (hack/gpu/README.md).
#   hack/gpu/bundle.sh VLLM_VERSION [--base FILE] [--with PKG]... [--piece-size 45M] [--out DIR]
#                      [--codec xz|gzip] [--level 9] [--xz-threads 2] [--no-keep-host]
# Defaults: --base = the H100 host's package list (tests/fixtures/vllm-0.22.0-h100/gpu-host-packages.txt),
# --out = .gpu-bundle/vllm-VERSION in the checkout (git-ignored).
# Wheels are cached in ${GDN_CACHE_DIR:-~/.cache/gdn-operator}/gpu-wheels.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 1 ] && [[ "$1" != -* ]] || { sed -n 2,7p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
VERSION="$1"; shift
BASE="$ROOT/tests/fixtures/vllm-0.22.0-h100/gpu-host-packages.txt"
OUT="$ROOT/.gpu-bundle/vllm-$VERSION"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --with|--piece-size|--codec|--level|--xz-level|--xz-threads) EXTRA+=("$1" "$2"); shift 2 ;;
    --no-keep-host) EXTRA+=("$1"); shift ;;
    *) echo "bundle.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -f "$BASE" ] || { echo "bundle.sh: --base $BASE: no such file (pip list / pip freeze output of the GPU host)" >&2; exit 2; }
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "bundle.sh: run hack/bootstrap.sh first (needs .venv with pyyaml and packaging)" >&2; exit 2; }
CACHE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}/gpu-wheels"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gdn-gpu-bundle.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
common=("$VERSION" --base "$BASE" --work "$WORK" --out "$OUT" --cache "$CACHE" "${EXTRA[@]}")
t0=$(date +%s)
"$PY" "$ROOT/hack/gpu/bundle.py" resolve "${common[@]}"
"$PY" "$ROOT/hack/gpu/bundle.py" build "${common[@]}"
echo "bundle.sh: done in $(( $(date +%s) - t0 ))s"
