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
#                                                    GDN_LEASE_PLAN (env): a plan file (hack/gpu/plans/*.txt) run instead of
#                                                    the extra step and release-serve, in order on one GPU after the
#                                                    training: lines `VERSION CAP_S[/STOPVER] STEP [-- ARGS]`; each
#                                                    step waits for VERSION's bundle, runs at most CAP_S (and never past
#                                                    UNTIL), and with /STOPVER is stopped once STOPVER's bundle is
#                                                    installed (work for the staging minutes of a later release); a
#                                                    VERSION written `+VERSION` runs beside the training (steps that
#                                                    time nothing), and the rest waits for both; a STEP written `&STEP`
#                                                    runs beside the steps after it until a line `wait`
#   hack/gpu/lease.sh plan VERSION FILE UNTIL        run a plan file's steps now (the `+` ones first; no training, no staging)
#   hack/gpu/lease.sh stage VERSION                  each later call: stage the carried piece(s) of every bundle the
#                                                    call carries (.gpu-bundle/vllm-*); install each once complete
#   hack/gpu/lease.sh wait VERSION SECONDS           block until the background work is done or SECONDS pass, print
#                                                    its progress, copy its files (<= 8) to $OUT
# The pieces travel in .gpu-bundle/vllm-VERSION (manifest.json + piece files; git-ignored, named in `carry`).
# State and results live under ${GDN_CACHE_DIR:-~/.cache/gdn-operator}/lease-VERSION, outside the checkout,
# which each call refreshes.  Every child runs with NVLink multicast off (hack/gpu/session.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
[ $# -ge 2 ] || { sed -n 2,29p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
CMD="$1" VERSION="$2"
CACHE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}"
STATE="$CACHE/lease-$VERSION"
SITE="$CACHE/gpu-site/vllm-$VERSION"
STAGE="$CACHE/gpu-stage/vllm-$VERSION"
export GDN_GPU_SITE="$SITE" GDN_GPU_VLLM_VERSION="$VERSION" GDN_PROD_MODEL="${GDN_PROD_MODEL:-$CACHE/prod-model}"
mkdir -p "$STATE"

stage_one() {  # stage_one VERSION: the carried pieces of that release's bundle; install it once complete
  local v="$1" t0 rc=0
  local stage_dir="$CACHE/gpu-stage/vllm-$v" site="$CACHE/gpu-site/vllm-$v"
  t0=$(date +%s%N)
  bash hack/gpu/stage-piece.sh ".gpu-bundle/vllm-$v" "$stage_dir" || rc=$?
  echo "lease: $(date +%T) $v staged in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$STATE/staging.log"
  if [ "$rc" = 0 ] && [ ! -f "$site/.installed-ok" ]; then
    t0=$(date +%s%N)
    local irc=0
    bash hack/gpu/install.sh "$stage_dir" "$site" || irc=$?
    [ "$irc" != 0 ] || touch "$site/.installed-ok"
    echo "lease: $(date +%T) $v install exited $irc in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$STATE/staging.log"
  fi
  [ "$rc" = 0 ] || [ "$rc" = 4 ]
}

stage() {  # every bundle this call carries (a plan can stage two releases in one lease)
  local ok=0 d v
  for d in .gpu-bundle/vllm-*/; do
    [ -f "$d/manifest.json" ] || continue
    v="$(basename "$d")"; v="${v#vllm-}"
    stage_one "$v" || ok=1
  done
  return "$ok"
}

end_step_processes() {  # end_step_processes TAG: SIGKILL every process whose environment has GDN_LEASE_STEP=TAG
  local f pid left=""
  for f in /proc/[0-9]*/environ; do
    pid="${f#/proc/}"; pid="${pid%/environ}"
    if tr '\0' '\n' 2>/dev/null <"$f" | grep -qxF "GDN_LEASE_STEP=$1"; then
      kill -9 "$pid" 2>/dev/null && left="$left $pid"
    fi
  done
  [ -z "$left" ] || echo "lease plan: $(date +%T) ended what the step left running:$left"
}

run_plan() {  # run_plan FILE UNTIL [early]: the plan's steps in order on GPU 0 (see the header); `early`: the `+` lines
  local plan="$1" until="$2" early="${3:-}" n=0 ver cap step rest stopver limit end pid bg="" tag scratch
  while read -r ver cap step rest; do
    case "$ver" in ''|'#'*) continue ;; esac
    if [ "$ver" = wait ]; then  # `wait`: the `&` steps started above end first
      [ -z "$bg" ] || { wait $bg || true; }
      bg=""; echo "lease plan: $(date +%T) the steps started together are done"; continue
    fi
    if [ -n "$early" ]; then case "$ver" in +*) ver="${ver#+}" ;; *) continue ;; esac
    else case "$ver" in +*) continue ;; esac
    fi
    n=$((n + 1)); stopver=""; tag=""
    case "$step" in '&'*) step="${step#&}"; tag="&" ;; esac
    [ -z "$early" ] || n="e$n"
    case "$cap" in */*) stopver="${cap#*/}"; cap="${cap%/*}" ;; esac
    until [ -f "$CACHE/gpu-site/vllm-$ver/.installed-ok" ] || [ "$(date +%s)" -gt "$until" ]; do sleep 2; done
    [ -f "$CACHE/gpu-site/vllm-$ver/.installed-ok" ] || { echo "lease plan: $(date +%T) step $n $step@$ver: no bundle before the deadline"; continue; }
    if [ -n "$stopver" ] && [ -f "$CACHE/gpu-site/vllm-$stopver/.installed-ok" ]; then
      echo "lease plan: $(date +%T) step $n $step@$ver skipped: $stopver is already installed"; continue
    fi
    end=$(( $(date +%s) + cap )); [ "$end" -le "$until" ] || end="$until"
    limit=$(( end - $(date +%s) ))
    [ "$limit" -ge 30 ] || { echo "lease plan: $(date +%T) step $n $step@$ver skipped: ${limit} s left"; continue; }
    echo "lease plan: $(date +%T) step $n $step@$ver for at most ${limit} s${stopver:+ (stopped once $stopver is installed)}"
    mkdir -p "$STATE/steps/$n-$step-$ver"
    # shellcheck disable=SC2086  # rest is the step's own words: `-- ARGS`
    scratch="$STATE/scratch/$n-$step"  # the step's working folder, and the tag its children inherit
    OUT="$STATE/steps/$n-$step-$ver" GDN_LEASE_STEP="$scratch" GDN_GPU_SITE="$CACHE/gpu-site/vllm-$ver" GDN_GPU_VLLM_VERSION="$ver" \
      CUDA_VISIBLE_DEVICES=0 GDN_SESSION_WORK="$scratch" \
      bash hack/gpu/session.sh "$step" --until "$end" $rest >"$STATE/steps/$n-$step-$ver/session.log" 2>&1 &
    pid=$!
    if [ -n "$tag" ]; then  # `&STEP`: runs beside the next steps until a `wait` line (steps that time nothing)
      bg="$bg $pid"; continue
    fi
    while kill -0 "$pid" 2>/dev/null; do
      if [ -n "$stopver" ] && [ -f "$CACHE/gpu-site/vllm-$stopver/.installed-ok" ]; then
        echo "lease plan: $(date +%T) step $n: $stopver installed, stopping $step@$ver"
        kill -TERM "$pid" 2>/dev/null || true
        break
      fi
      sleep 2
    done
    wait "$pid" && echo "lease plan: $(date +%T) step $n done" || echo "lease plan: $(date +%T) step $n exited $?"
    # an engine a stopped step left behind would hold GPU memory the next step needs (steps share one GPU in turn):
    # every process that inherited this step's GDN_LEASE_STEP (engines run in sessions of their own) is ended
    end_step_processes "$scratch"
  done <"$plan"
  [ -z "$bg" ] || { wait $bg || true; }
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
  plan)  # plan VERSION FILE UNTIL: a plan's steps now, without training or staging (a dry run: steps with --dry-run)
    run_plan "${3:?plan needs FILE}" "${4:?plan needs UNTIL (epoch seconds)}" early
    run_plan "$3" "$4"
    ;;
  run)  # the background part (started by `start`)
    UNTIL="$3" TRAIN_S="$4" EXTRA="${5:-}" EXTRA_S="${6:-300}"
    export GDN_GPU_NAME
    GDN_GPU_NAME="$(head -1 "$STATE/gpus.txt" | cut -d, -f2 | sed 's/^ //')"
    train=""
    if [ "$TRAIN_S" -gt 0 ]; then  # TRAIN_S 0: no training (a plan on the committed tiny model, GDN_PROD_MODEL)
      echo "lease run: $(date +%T) training for ${TRAIN_S} s on GPU 0"
      OUT="$STATE/train" bash hack/gpu/session.sh prodmodel-train --until $(( $(date +%s) + TRAIN_S )) &
      train=$!
    fi
    # a plan waits for each step's own bundle (run_plan); without one, the training overlaps the staging
    until [ -n "${GDN_LEASE_PLAN:-}" ] || [ -f "$SITE/.installed-ok" ] || [ "$(date +%s)" -gt "$UNTIL" ]; do sleep 2; done
    echo "lease run: $(date +%T) bundle installed: $([ -f "$SITE/.installed-ok" ] && echo yes || echo no)"
    extra=""
    if [ -n "$EXTRA" ] && [ -f "$SITE/.installed-ok" ]; then
      echo "lease run: $(date +%T) session step $EXTRA on GPU 1 for at most ${EXTRA_S} s"
      OUT="$STATE/extra" CUDA_VISIBLE_DEVICES=1 bash hack/gpu/session.sh "$EXTRA" --until $(( $(date +%s) + EXTRA_S )) \
        >"$STATE/extra.log" 2>&1 &
      extra=$!
    fi
    early=""
    if [ -n "${GDN_LEASE_PLAN:-}" ]; then  # the plan's `+` steps (correctness, no timing) run beside the training
      run_plan "$GDN_LEASE_PLAN" "$UNTIL" early &
      early=$!
    fi
    [ -z "$train" ] || wait "$train" || echo "lease run: training exited $?"
    [ -z "$early" ] || wait "$early" || echo "lease run: the early steps exited $?"
    if [ -n "${GDN_LEASE_PLAN:-}" ]; then
      echo "lease run: $(date +%T) training done; the plan $GDN_LEASE_PLAN until $(date -d "@$UNTIL" +%T)"
      run_plan "$GDN_LEASE_PLAN" "$UNTIL"
      echo "lease run: $(date +%T) done"
      touch "$STATE/done"
      exit 0
    fi
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
      if [ -d "$STATE/steps" ]; then  # a plan's results: every file of every step in one archive (<= 8 files come back)
        tar -C "$STATE" -cJf "$OUT/lease-steps.tar.xz" steps 2>/dev/null || true
      fi
      tar -C "$STATE" -cJf "$OUT/lease-logs.tar.xz" --exclude='*.json' --ignore-failed-read \
        serve extra train extra.log staging.log gpus.txt 2>/dev/null || true
      ls -la "$OUT"
    fi
    ;;
  *) echo "lease: unknown command $CMD (start, stage, plan, wait)" >&2; exit 2 ;;
esac
