#!/usr/bin/env bash
# One GPU lease spread over several short device calls: the work runs in the background (its own process
# session, so it outlives each call) while the calls bring the bundle's pieces and collect the results.
#   hack/gpu/lease.sh start VERSION UNTIL [TRAIN_S [EXTRA_STEP EXTRA_S]]
#                                                    first call: stage the carried piece(s), then in the background:
#                                                    train the production-geometry model on GPU 0 for TRAIN_S
#                                                    (default 220) while the rest of the bundle arrives, wait for
#                                                    the install, run the session step EXTRA_STEP (e.g. graphs-tiny)
#                                                    on GPU 1 for at most EXTRA_S, then `session.sh release-serve`
#                                                    until UNTIL (epoch seconds)
#                                                    GDN_RELEASE_ARGS (env, word-split): extra arguments of
#                                                    release-serve's bench (e.g. "--engines a,p --workloads prefix")
#   hack/gpu/lease.sh stage VERSION                  each later call: stage the carried piece(s); install once complete
#   hack/gpu/lease.sh wait VERSION SECONDS           block until the background work is done or SECONDS pass, print
#                                                    its progress, copy its files (<= 8) to $OUT
# The pieces travel in .gpu-bundle/vllm-VERSION (manifest.json + piece files; git-ignored, named in `carry`).
# State and results live under ${GDN_CACHE_DIR:-~/.cache/gdn-operator}/lease-VERSION, outside the checkout,
# which each call refreshes.  Every child runs with NVLink multicast off (hack/gpu/session.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
[ $# -ge 2 ] || { sed -n 2,17p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
CMD="$1" VERSION="$2"
CACHE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}"
STATE="$CACHE/lease-$VERSION"
SITE="$CACHE/gpu-site/vllm-$VERSION"
STAGE="$CACHE/gpu-stage/vllm-$VERSION"
export GDN_GPU_SITE="$SITE" GDN_GPU_VLLM_VERSION="$VERSION" GDN_PROD_MODEL="$CACHE/prod-model"
mkdir -p "$STATE"

stage() {
  local t0 rc=0
  t0=$(date +%s%N)
  bash hack/gpu/stage-piece.sh ".gpu-bundle/vllm-$VERSION" "$STAGE" || rc=$?
  echo "lease: $(date +%T) staged in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$STATE/staging.log"
  if [ "$rc" = 0 ] && [ ! -f "$SITE/.installed-ok" ]; then
    t0=$(date +%s%N)
    local irc=0
    bash hack/gpu/install.sh "$STAGE" "$SITE" || irc=$?
    [ "$irc" != 0 ] || touch "$SITE/.installed-ok"
    echo "lease: $(date +%T) install exited $irc in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$STATE/staging.log"
  fi
  [ "$rc" = 0 ] || [ "$rc" = 4 ]
}

case "$CMD" in
  start)
    UNTIL="${3:?start needs UNTIL (epoch seconds)}" TRAIN_S="${4:-220}" EXTRA="${5:-}" EXTRA_S="${6:-300}"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$STATE/gpus.txt"
    python3 -c 'import torch, sys; print("host torch", torch.__version__, "python", sys.version.split()[0])' | tee -a "$STATE/gpus.txt" || true
    python3 -m pip list --format=freeze 2>/dev/null >"$STATE/host-packages.txt" || true  # the next bundle's --base
    rm -f "$STATE/done" "$STATE/run.log"
    stage
    # the conflict gate needs only the manifest: a conflict the accept list misses shows now, not after the last piece
    [ -f "$SITE/.installed-ok" ] || bash hack/gpu/install.sh "$STAGE" "$SITE" --check-only 2>&1 | tee -a "$STATE/staging.log" || true
    # the background work runs from its own copy: each call refreshes the checkout under a running script
    rm -rf "$STATE/src" && mkdir -p "$STATE/src"
    tar -C "$ROOT" --exclude=./.gpu-bundle --exclude=./.git -cf - . | tar -C "$STATE/src" -xf -
    # a new process session with every inherited descriptor closed (a pipe of the caller held open would keep the
    # call waiting for the background work)
    python3 -c 'import subprocess, sys
subprocess.Popen(sys.argv[2:], cwd=sys.argv[1], start_new_session=True, close_fds=True, stdin=subprocess.DEVNULL,
                 stdout=open(sys.argv[1] + "/../run.log", "ab"), stderr=subprocess.STDOUT)' \
      "$STATE/src" bash hack/gpu/lease.sh run "$VERSION" "$UNTIL" "$TRAIN_S" "$EXTRA" "$EXTRA_S"
    echo "lease: background work started from $STATE/src, deadline $(date -d "@$UNTIL" +%T)"
    ;;
  stage)
    stage
    ;;
  run)  # the background part (started by `start`)
    UNTIL="$3" TRAIN_S="$4" EXTRA="${5:-}" EXTRA_S="${6:-300}"
    export GDN_GPU_NAME
    GDN_GPU_NAME="$(head -1 "$STATE/gpus.txt" | cut -d, -f2 | sed 's/^ //')"
    echo "lease run: $(date +%T) training for ${TRAIN_S} s on GPU 0"
    OUT="$STATE/train" bash hack/gpu/session.sh prodmodel-train --until $(( $(date +%s) + TRAIN_S )) &
    train=$!
    until [ -f "$SITE/.installed-ok" ] || [ "$(date +%s)" -gt "$UNTIL" ]; do sleep 2; done
    echo "lease run: $(date +%T) bundle installed: $([ -f "$SITE/.installed-ok" ] && echo yes || echo no)"
    extra=""
    if [ -n "$EXTRA" ] && [ -f "$SITE/.installed-ok" ]; then
      echo "lease run: $(date +%T) session step $EXTRA on GPU 1 for at most ${EXTRA_S} s"
      OUT="$STATE/extra" CUDA_VISIBLE_DEVICES=1 bash hack/gpu/session.sh "$EXTRA" --until $(( $(date +%s) + EXTRA_S )) \
        >"$STATE/extra.log" 2>&1 &
      extra=$!
    fi
    wait "$train" || echo "lease run: training exited $?"
    echo "lease run: $(date +%T) training done; serving until $(date -d "@$UNTIL" +%T)"
    # shellcheck disable=SC2086  # GDN_RELEASE_ARGS is a list of words
    OUT="$STATE/serve" bash hack/gpu/session.sh release-serve --until "$UNTIL" -- ${GDN_RELEASE_ARGS:-} || echo "lease run: release-serve exited $?"
    [ -z "$extra" ] || wait "$extra" || echo "lease run: lease-extra exited $?"
    echo "lease run: $(date +%T) done"
    touch "$STATE/done"
    ;;
  wait)
    SECONDS_MAX="${3:?wait needs SECONDS}"
    end=$(( $(date +%s) + SECONDS_MAX ))
    while [ ! -f "$STATE/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    echo "lease wait: done=$([ -f "$STATE/done" ] && echo yes || echo no) at $(date +%T)"
    tail -n 40 "$STATE/run.log" || true
    grep -h "tok/s\|ready:\|not ready" "$STATE"/serve/*stdout.log 2>/dev/null | tail -n 40 || true
    if [ -n "${OUT:-}" ]; then
      mkdir -p "$OUT"
      for f in "$STATE"/serve/release.json "$STATE"/train/training.json "$STATE"/extra/*.json "$STATE/run.log" "$STATE/host-packages.txt"; do
        [ -f "$f" ] && cp "$f" "$OUT/" || true
      done
      tar -C "$STATE" -cJf "$OUT/lease-logs.tar.xz" --exclude='*.json' --ignore-failed-read \
        serve extra train extra.log staging.log gpus.txt 2>/dev/null || true
      ls -la "$OUT"
    fi
    ;;
  *) echo "lease: unknown command $CMD (start, stage, wait)" >&2; exit 2 ;;
esac
