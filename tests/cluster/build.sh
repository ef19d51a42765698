#!/usr/bin/env bash
# Build the real control-plane binaries for gdn-operator's integration tests and dev mode
# from the Go module proxy (recipe: ../shared/docs/test-cluster.md).
#
#   tests/cluster/build.sh core        etcd + kube-apiserver               (envtest-style tier)
#   tests/cluster/build.sh full        + kube-controller-manager, kube-scheduler, kwok and the LWS controller (kwok and
#                                      LWS: one Go build in tests/cluster/kwok, which pins both)
#   tests/cluster/build.sh kubectl     kubectl built from the same kube module (optional)
#   tests/cluster/build.sh lws         the LeaderWorkerSet controller (sigs.k8s.io/lws cmd/) and the add-on modules
#   tests/cluster/build.sh promop      the Prometheus Operator (github.com/prometheus-operator/prometheus-operator
#                                      cmd/operator only, one Go build; its CRDs are read from the module cache)
#   tests/cluster/build.sh prometheus  the Prometheus server (github.com/prometheus/prometheus cmd/prometheus) with
#                                      only Kubernetes service discovery (prometheus/plugins.go overlay): Debian's
#                                      package is built without it
#   tests/cluster/build.sh addons      fetch (no build) the LWS, KEDA, Gateway API Inference Extension, KServe and
#                                      wg-policy-prototypes modules: their CRDs are read from the module cache,
#                                      never committed
#   tests/cluster/build.sh release     the release tier (issue 39): crane (github.com/google/go-containerregistry
#                                      cmd/crane: `crane registry serve` is the OCI registry the install test pushes
#                                      the chart to) and actionlint (github.com/rhysd/actionlint cmd/actionlint: the
#                                      static check of .github/workflows/); each one Go build from the module cache
#   tests/cluster/build.sh paths       print the binary paths (no build)
#   tests/cluster/build.sh regen       regenerate tests/cluster/kube/go.mod replace lines from the
#                                      real k8s.io/kubernetes go.mod (on a version bump), then tidy
#
# Binaries go to ${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}/bin/<component>-<version>/<binary>,
# outside the work tree. A component is rebuilt only if its binary is missing or its --version
# output does not match the pinned version, so a second run is instant.
# Cold build times are appended to $CACHE/build-times.log.
set -euo pipefail

# ---- pinned versions -----------------------------------------------------------------------
# k8s.io/kubernetes v1.35.7 is refused by the module proxy here ("403 This module version is not
# available"); v1.35.8 is the newest 1.35 patch that resolves (v1.35.9/v1.35.10 do not).
K8S_VERSION=v1.35.8
ETCD_VERSION=v3.6.14
KWOK_VERSION=v0.8.0
# Scale-out add-ons (issue 17). Newest versions the module proxy serves here: lws v0.9.1/v0.10.0,
# keda v2.22.0 and GIE v1.4.1 are refused ("403 This module version is not available").
LWS_VERSION=v0.9.0
KEDA_VERSION=v2.21.0
GIE_VERSION=v1.5.0
# GDNGuard (issue 35): the real CRDs of the workloads a guard watches and of the report it writes. KServe v0.16.0
# (LLMInferenceService, config/crd/full/llmisvc). The PolicyReport CRD (wgpolicyk8s.io/v1alpha2, what Kyverno and
# the Trivy operator write): sigs.k8s.io/wg-policy-prototypes has no tags; this pseudo-version is one a released
# go.mod requires, and the newest the module proxy serves here (its list and newer ones are refused). KAITO
# (github.com/kaito-project/kaito) is refused by the module proxy here for every tag asked (v0.5.1 .. v0.8.0).
KSERVE_VERSION=v0.16.0
WGPOLICY_VERSION=v0.0.0-20210911211205-fb8f67bb6d38
# Monitoring stack (issue 28): the newest version the module proxy lists here.
PROMOP_VERSION=v0.85.0
# Prometheus 3.5.0 (module version v0.305.0): the newest release in the Prometheus Operator 0.85 compatibility
# matrix (its module is already required by the operator's go.mod).
PROMETHEUS_VERSION=v3.5.0
PROMETHEUS_MODULE_VERSION=v0.305.0
# Release tier (issue 39): the newest versions the module proxy serves here.
CRANE_VERSION=v0.22.1
ACTIONLINT_VERSION=v1.7.12

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}"
BINROOT="$CACHE/bin"
TIMES="$CACHE/build-times.log"
STG="v0.${K8S_VERSION#v1.}"
K8S_MINOR="${K8S_VERSION#v1.}"; K8S_MINOR="${K8S_MINOR%%.*}"

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-mod=readonly -trimpath"

log() { printf '[build.sh] %s\n' "$*" >&2; }

bin_dir() {  # component version
  printf '%s/%s-%s' "$BINROOT" "$1" "$2"
}

# version_ok <binary-path> <expected-substring> <version-args...>
version_ok() {
  local b="$1" want="$2"; shift 2
  [[ -x "$b" ]] || return 1
  local out
  # The whole output: `| head -3` under pipefail failed falsely when head closed the pipe before etcd's
  # 4-line --version output was written (SIGPIPE, exit 141), and a cached binary was then rebuilt.
  out="$("$b" "$@" 2>&1)" || return 1
  [[ "$out" == *"$want"* ]]
}

record_time() {  # component version seconds
  mkdir -p "$CACHE"
  printf '%s\t%s\t%s\t%ss\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2" "$3" "$(nproc) cores" >>"$TIMES"
}

kube_ldflags() {
  local d ldf="-s -w" p
  d="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    ldf="$ldf -X $p.gitTreeState=clean -X $p.buildDate=$d"
  done
  printf '%s' "$ldf"
}

# ---- components ----------------------------------------------------------------------------
build_etcd() {
  local dir b t0
  dir="$(bin_dir etcd "$ETCD_VERSION")"; b="$dir/etcd"
  if version_ok "$b" "etcd Version: ${ETCD_VERSION#v}" --version; then
    log "etcd $ETCD_VERSION: cached ($b)"; return 0
  fi
  log "etcd $ETCD_VERSION: building go.etcd.io/etcd/server/v3 -> $b"
  t0=$SECONDS; mkdir -p "$dir"
  (cd "$HERE/etcd" && go build -p 2 -ldflags "-s -w" -o "$b.tmp" go.etcd.io/etcd/server/v3)
  mv -f "$b.tmp" "$b"
  version_ok "$b" "etcd Version: ${ETCD_VERSION#v}" --version || { log "etcd --version mismatch: $("$b" --version 2>&1 | head -1)"; exit 1; }
  log "etcd $ETCD_VERSION: built in $((SECONDS - t0))s"
  record_time etcd "$ETCD_VERSION" $((SECONDS - t0))
}

# build_kube <cmd>...  (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)
build_kube() {
  local c dir b todo=() pkgs=() t0
  dir="$(bin_dir kube "$K8S_VERSION")"
  for c in "$@"; do
    b="$dir/$c"
    local vargs=(--version); [[ "$c" == kubectl ]] && vargs=(version --client)
    if version_ok "$b" "$K8S_VERSION" "${vargs[@]}"; then
      log "$c $K8S_VERSION: cached ($b)"
    else
      todo+=("$c"); pkgs+=("k8s.io/kubernetes/cmd/$c")
    fi
  done
  [[ ${#todo[@]} -eq 0 ]] && return 0
  log "${todo[*]} $K8S_VERSION: building from k8s.io/kubernetes (staging $STG) -> $dir/"
  t0=$SECONDS; mkdir -p "$dir/.tmp"
  (cd "$HERE/kube" && go build -p 2 -ldflags "$(kube_ldflags)" -o "$dir/.tmp/" "${pkgs[@]}")
  for c in "${todo[@]}"; do
    mv -f "$dir/.tmp/$c" "$dir/$c"
    local vargs=(--version); [[ "$c" == kubectl ]] && vargs=(version --client)
    version_ok "$dir/$c" "$K8S_VERSION" "${vargs[@]}" || { log "$c version mismatch: $("$dir/$c" "${vargs[@]}" 2>&1 | head -1)"; exit 1; }
  done
  rmdir "$dir/.tmp" 2>/dev/null || true
  log "${todo[*]} $K8S_VERSION: built in $((SECONDS - t0))s"
  record_time "$(IFS=+; echo "${todo[*]}")" "$K8S_VERSION" $((SECONDS - t0))
}

# module_dir <module> <version>: the module's source in the Go module cache (downloaded on first use)
module_dir() {
  (cd "$(mktemp -d)" && GOFLAGS= go mod download -json "$1@$2" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')
}

# build_sigs <name>...  (kwok, lws): one `go build` in tests/cluster/kwok, whose go.mod pins both sigs.k8s.io
# modules: kwok and the LWS controller share client-go, apimachinery and controller-runtime (one set of versions,
# compiled once). Built apart, each in its own module, the pair cost 318 CPU-seconds cold; together 232.
build_sigs() {
  local c dir b want todo=() pkgs=() tmp t0
  local -A pkg=([kwok]=sigs.k8s.io/kwok/cmd/kwok [lws]=sigs.k8s.io/lws/cmd)
  for c in "$@"; do
    sigs_bin "$c"
    if version_ok "$b" "$want" --version; then log "$c: cached ($b)"; else todo+=("$c"); pkgs+=("${pkg[$c]}"); fi
  done
  [[ ${#todo[@]} -eq 0 ]] && return 0
  grep -q "sigs.k8s.io/kwok $KWOK_VERSION" "$HERE/kwok/go.mod" && grep -q "sigs.k8s.io/lws $LWS_VERSION" "$HERE/kwok/go.mod" \
    || { log "tests/cluster/kwok/go.mod does not pin kwok $KWOK_VERSION and lws $LWS_VERSION: run go get ...@VERSION there"; exit 1; }
  log "${todo[*]}: building ${pkgs[*]} (tests/cluster/kwok/go.mod) -> $BINROOT/"
  t0=$SECONDS; mkdir -p "$BINROOT"; tmp="$(mktemp -d "$BINROOT/.sigs.XXXXXX")"
  (cd "$HERE/kwok" && go build -p 2 -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" -o "$tmp/" "${pkgs[@]}")
  for c in "${todo[@]}"; do
    sigs_bin "$c"; mkdir -p "$dir"
    mv -f "$tmp/${pkg[$c]##*/}" "$b"
    version_ok "$b" "$want" --version || { log "$c --version mismatch: $("$b" --version 2>&1 | head -1)"; exit 1; }
  done
  rm -rf "$tmp"
  log "${todo[*]}: built in $((SECONDS - t0))s"
  record_time "$(IFS=+; echo "${todo[*]}")" "$KWOK_VERSION+$LWS_VERSION" $((SECONDS - t0))
}

sigs_bin() {  # sets dir, b and want (the --version substring) for kwok or lws
  case "$1" in
    kwok) dir="$(bin_dir kwok "$KWOK_VERSION")"; b="$dir/kwok"; want="${KWOK_VERSION#v}" ;;
    lws)  dir="$(bin_dir lws "$LWS_VERSION")"; b="$dir/lws-manager"; want="Version: $LWS_VERSION" ;;
  esac
}

build_promop() {
  # Built through tests/cluster/promop/go.mod (a `tool` module pinning the operator and its two
  # submodules pkg/apis/monitoring and pkg/client): the operator's own go.mod replaces those with
  # ./pkg/... directories that its module zip leaves out, so `go build ./cmd/operator` inside the
  # module cache fails. Only cmd/operator is built (no admission webhook, no config reloader).
  local dir b t0 pc=github.com/prometheus/common/version
  dir="$(bin_dir prometheus-operator "$PROMOP_VERSION")"; b="$dir/operator"
  if version_ok "$b" "version ${PROMOP_VERSION#v}" --version; then
    log "prometheus-operator $PROMOP_VERSION: cached ($b)"; return 0
  fi
  grep -q "github.com/prometheus-operator/prometheus-operator $PROMOP_VERSION" "$HERE/promop/go.mod" \
    || { log "tests/cluster/promop/go.mod does not pin $PROMOP_VERSION: run go get ...@$PROMOP_VERSION there (and its two submodules)"; exit 1; }
  log "prometheus-operator $PROMOP_VERSION: building github.com/prometheus-operator/prometheus-operator/cmd/operator -> $b"
  t0=$SECONDS; mkdir -p "$dir"
  (cd "$HERE/promop" && go build -p 2 -ldflags "-s -w -X $pc.Version=${PROMOP_VERSION#v} -X $pc.Branch=module-proxy -X $pc.Revision=$PROMOP_VERSION" \
     -o "$b.tmp" github.com/prometheus-operator/prometheus-operator/cmd/operator)
  mv -f "$b.tmp" "$b"
  version_ok "$b" "version ${PROMOP_VERSION#v}" --version || { log "prometheus-operator --version mismatch: $("$b" --version 2>&1 | head -1)"; exit 1; }
  log "prometheus-operator $PROMOP_VERSION: built in $((SECONDS - t0))s"
  record_time prometheus-operator "$PROMOP_VERSION" $((SECONDS - t0))
}

build_prometheus() {
  local dir b t0 src pc=github.com/prometheus/common/version
  dir="$(bin_dir prometheus "$PROMETHEUS_VERSION")"; b="$dir/prometheus"
  if version_ok "$b" "version ${PROMETHEUS_VERSION#v}" --version; then
    log "prometheus $PROMETHEUS_VERSION: cached ($b)"; return 0
  fi
  src="$(module_dir github.com/prometheus/prometheus "$PROMETHEUS_MODULE_VERSION")"
  log "prometheus $PROMETHEUS_VERSION: building $src/cmd/prometheus (Kubernetes SD only) -> $b"
  t0=$SECONDS; mkdir -p "$dir"
  # `go build -overlay` may not replace files in the module cache: build from a writable copy of the
  # module source (outside the work tree, removed afterwards) with plugins.go swapped.
  rm -rf "$dir/src"; cp -r "$src" "$dir/src"; chmod -R u+w "$dir/src"
  cp "$HERE/prometheus/plugins.go" "$dir/src/plugins/plugins.go"
  (cd "$dir/src" && go build -p 2 \
     -ldflags "-s -w -X $pc.Version=${PROMETHEUS_VERSION#v} -X $pc.Branch=module-proxy -X $pc.Revision=$PROMETHEUS_MODULE_VERSION" \
     -o "$b.tmp" ./cmd/prometheus)
  rm -rf "$dir/src"
  mv -f "$b.tmp" "$b"
  version_ok "$b" "version ${PROMETHEUS_VERSION#v}" --version || { log "prometheus --version mismatch: $("$b" --version 2>&1 | head -1)"; exit 1; }
  log "prometheus $PROMETHEUS_VERSION: built in $((SECONDS - t0))s"
  record_time prometheus "$PROMETHEUS_VERSION" $((SECONDS - t0))
}

# build_from_module <component> <version> <module> <package> <binary> <version-substring> <ldflags> <version-args...>
# One `go build` of <package> inside the module's own source in the module cache (its go.mod and go.sum pin
# every dependency), like build_lws.
build_from_module() {
  local comp="$1" ver="$2" mod="$3" pkg="$4" name="$5" want="$6" ldf="$7" dir b t0 src
  shift 7
  dir="$(bin_dir "$comp" "$ver")"; b="$dir/$name"
  if version_ok "$b" "$want" "$@"; then
    log "$comp $ver: cached ($b)"; return 0
  fi
  src="$(module_dir "$mod" "$ver")"
  log "$comp $ver: building $mod/$pkg -> $b"
  t0=$SECONDS; mkdir -p "$dir"
  (cd "$src" && go build -p 2 -ldflags "-s -w $ldf" -o "$b.tmp" "./$pkg")
  mv -f "$b.tmp" "$b"
  version_ok "$b" "$want" "$@" || { log "$comp version mismatch: $("$b" "$@" 2>&1 | head -1)"; exit 1; }
  log "$comp $ver: built in $((SECONDS - t0))s"
  record_time "$comp" "$ver" $((SECONDS - t0))
}

build_crane() {
  build_from_module crane "$CRANE_VERSION" github.com/google/go-containerregistry cmd/crane crane "$CRANE_VERSION" \
    "-X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$CRANE_VERSION" version
}

build_actionlint() {
  build_from_module actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint cmd/actionlint actionlint \
    "$ACTIONLINT_VERSION" "-X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION" -version
}

fetch_addons() {
  module_dir sigs.k8s.io/lws "$LWS_VERSION" >/dev/null
  module_dir github.com/kedacore/keda/v2 "$KEDA_VERSION" >/dev/null
  module_dir sigs.k8s.io/gateway-api-inference-extension "$GIE_VERSION" >/dev/null
  module_dir github.com/kserve/kserve "$KSERVE_VERSION" >/dev/null
  module_dir sigs.k8s.io/wg-policy-prototypes "$WGPOLICY_VERSION" >/dev/null
  log "add-on modules fetched: lws $LWS_VERSION, keda $KEDA_VERSION, gateway-api-inference-extension $GIE_VERSION," \
    "kserve $KSERVE_VERSION, wg-policy-prototypes $WGPOLICY_VERSION"
}

# addon_src <module> <version>: the module dir if already in the module cache (no download)
addon_src() {
  local d; d="$(go env GOMODCACHE)/$1@$2"
  [[ -d "$d" ]] && printf '%s' "$d"
}

kwok_src() {
  (cd "$HERE/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
}

print_paths() {
  local k; k="$(bin_dir kube "$K8S_VERSION")"
  cat <<EOF
K8S_VERSION=$K8S_VERSION
ETCD_VERSION=$ETCD_VERSION
KWOK_VERSION=$KWOK_VERSION
ETCD=$(bin_dir etcd "$ETCD_VERSION")/etcd
KUBE_APISERVER=$k/kube-apiserver
KUBE_CONTROLLER_MANAGER=$k/kube-controller-manager
KUBE_SCHEDULER=$k/kube-scheduler
KUBECTL=$k/kubectl
KWOK=$(bin_dir kwok "$KWOK_VERSION")/kwok
KWOK_SRC=$(kwok_src 2>/dev/null || true)
LWS_VERSION=$LWS_VERSION
KEDA_VERSION=$KEDA_VERSION
GIE_VERSION=$GIE_VERSION
LWS_MANAGER=$(bin_dir lws "$LWS_VERSION")/lws-manager
PROMOP_VERSION=$PROMOP_VERSION
PROMETHEUS_OPERATOR=$(bin_dir prometheus-operator "$PROMOP_VERSION")/operator
PROMETHEUS_VERSION=$PROMETHEUS_VERSION
PROMETHEUS=$(bin_dir prometheus "$PROMETHEUS_VERSION")/prometheus
PROMOP_SRC=$(addon_src github.com/prometheus-operator/prometheus-operator "$PROMOP_VERSION" || true)
LWS_SRC=$(addon_src sigs.k8s.io/lws "$LWS_VERSION" || true)
KEDA_SRC=$(addon_src github.com/kedacore/keda/v2 "$KEDA_VERSION" || true)
CRANE_VERSION=$CRANE_VERSION
CRANE=$(bin_dir crane "$CRANE_VERSION")/crane
ACTIONLINT_VERSION=$ACTIONLINT_VERSION
ACTIONLINT=$(bin_dir actionlint "$ACTIONLINT_VERSION")/actionlint
GIE_SRC=$(addon_src sigs.k8s.io/gateway-api-inference-extension "$GIE_VERSION" || true)
KSERVE_VERSION=$KSERVE_VERSION
KSERVE_SRC=$(addon_src github.com/kserve/kserve "$KSERVE_VERSION" || true)
WGPOLICY_VERSION=$WGPOLICY_VERSION
WGPOLICY_SRC=$(addon_src sigs.k8s.io/wg-policy-prototypes "$WGPOLICY_VERSION" || true)
EOF
}

regen() {
  local gomod m
  cd "$HERE/kube"
  gomod="$(cd "$(mktemp -d)" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
           | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  # Drop every existing replace, then add one per staging module of the real go.mod.
  GOFLAGS= go mod edit -json | python3 -c 'import json,sys; [print(r["Old"]["Path"]) for r in json.load(sys.stdin).get("Replace") or []]' \
    | while read -r m; do GOFLAGS= go mod edit -dropreplace="$m"; done
  grep -E '=> \./staging/src/' "$gomod" | awk '{print $1}' | while read -r m; do
    GOFLAGS= go mod edit -replace="$m=$m@$STG"
  done
  GOFLAGS= go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  GOFLAGS= go mod tidy
  log "kube/go.mod: $(grep -c '=> k8s.io' go.mod) replace lines at $STG (upstream has $(grep -cE '=> \./staging/src/' "$gomod"))"
}

# ---- main ----------------------------------------------------------------------------------
tier="${1:-core}"
T0=$SECONDS
case "$tier" in
  core)    build_etcd; build_kube kube-apiserver ;;
  full)    build_etcd; build_kube kube-apiserver kube-controller-manager kube-scheduler; build_sigs kwok lws ;;
  kubectl) build_kube kubectl ;;
  all)     build_etcd; build_kube kube-apiserver kube-controller-manager kube-scheduler kubectl; build_sigs kwok lws ;;
  lws)     fetch_addons; build_sigs lws ;;
  promop)  build_promop ;;
  prometheus) build_prometheus ;;
  monitoring) build_promop; build_prometheus ;;
  addons)  fetch_addons ;;
  release) build_crane; build_actionlint ;;
  paths)   print_paths; exit 0 ;;
  regen)   regen; exit 0 ;;
  *) echo "usage: $0 core|full|kubectl|all|lws|promop|prometheus|monitoring|release|addons|paths|regen" >&2; exit 2 ;;
esac
log "tier '$tier' ready in $((SECONDS - T0))s (binaries under $BINROOT)"
print_paths
