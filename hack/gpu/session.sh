#!/usr/bin/env bash
# One step of a GPU session inside a hard deadline; results (<= 8 flat files) in $OUT. See hack/gpu/session.py.
#   hack/gpu/session.sh stall|multinode|check|prodmodel-train|prodmodel-serve [--until EPOCH] [--budget S] [--dry-run] [-- step args]
# Runs with the host's python3 (torch, transformers, PyYAML) and the installed offline bundle
# (${GDN_GPU_SITE:-~/.cache/gdn-operator/gpu-site/vllm-0.22.0}); NVLink multicast stays off in every child.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader || true
exec "${GDN_GPU_PYTHON:-python3}" hack/gpu/session.py "$@"
