#!/usr/bin/env bash
# The one command that runs all tests on a fresh machine:
#   - Python env (.venv) with the operator and test deps
#   - the real control plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kwok),
#     built from the Go module proxy into ${GDN_CACHE_DIR:-~/.cache/gdn-operator} (cached by version)
#   - helm, kubectl and promtool
#   - the real vLLM CPU engine venv (cached by version)
# then pytest over tests/. Extra arguments go to pytest (e.g. hack/test.sh tests/rules -x).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
t0=$(date +%s)
bash hack/bootstrap.sh
[ -x tests/cluster/build.sh ] && bash tests/cluster/build.sh full
[ -f hack/tools.sh ] && bash hack/tools.sh
[ -f hack/vllm-cpu-env.sh ] && [ "${GDN_SKIP_ENGINE:-0}" != 1 ] && bash hack/vllm-cpu-env.sh
echo "test.sh: set-up took $(( $(date +%s) - t0 ))s"
set +e
"$ROOT/.venv/bin/python" -m pytest -p no:cacheprovider "${@:-tests}"
rc=$?
set -e
echo "test.sh: total $(( $(date +%s) - t0 ))s"
exit $rc
