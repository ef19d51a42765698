#!/usr/bin/env bash
# Package the Helm chart and push it to an OCI registry: the release workflow's chart step
# (.github/workflows/release.yml), run as is by tests/hack/test_release.py and tests/charts/test_chart_registry.py
# against a local `crane registry serve`.
#
#   hack/release/chart.sh package OUTDIR                 helm package charts/gdn-operator -> OUTDIR/gdn-operator-<version>.tgz
#   hack/release/chart.sh push OUTDIR REGISTRY [--plain-http]
#                                                        package, then helm push to oci://REGISTRY/charts;
#                                                        prints "REF@DIGEST" (the ref cosign signs)
#   CHART_DIR=DIR overrides the chart (the previous release's chart from git history, in the upgrade test).
# The chart's version must equal its appVersion (one version for operator, image and chart).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CHART_DIR="${CHART_DIR:-$ROOT/charts/gdn-operator}"
HELM="${HELM:-$(bash "$ROOT/hack/tools.sh" paths | sed -n 's/^HELM=//p')}"

die() { printf 'chart.sh: %s\n' "$*" >&2; exit 1; }

chart_field() {  # field
  sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" "$CHART_DIR/Chart.yaml"
}

package() {  # outdir
  local out="$1" version app
  version="$(chart_field version)"; app="$(chart_field appVersion)"
  [[ -n "$version" && "$version" == "$app" ]] \
    || die "$CHART_DIR/Chart.yaml: version ($version) must equal appVersion ($app): set both to the release version"
  mkdir -p "$out"
  "$HELM" package "$CHART_DIR" --destination "$out" >/dev/null
  [[ -f "$out/gdn-operator-$version.tgz" ]] || die "helm package wrote no $out/gdn-operator-$version.tgz"
  printf '%s\n' "$out/gdn-operator-$version.tgz"
}

push() {  # outdir registry [--plain-http]
  local out="$1" registry="$2" tgz res digest version
  shift 2
  tgz="$(package "$out")"
  version="$(chart_field version)"
  res="$("$HELM" push "$tgz" "oci://$registry/charts" "$@" 2>&1)" || die "helm push failed: $res"
  digest="$(printf '%s\n' "$res" | sed -n 's/^Digest: *//p')"
  [[ "$digest" == sha256:* ]] || die "helm push printed no digest: $res"
  printf '%s/charts/gdn-operator:%s@%s\n' "$registry" "$version" "$digest"
}

case "${1:-}" in
  package) [[ $# -eq 2 ]] || die "usage: chart.sh package OUTDIR"; package "$2" ;;
  push) [[ $# -ge 3 ]] || die "usage: chart.sh push OUTDIR REGISTRY [--plain-http]"; shift; push "$@" ;;
  *) die "usage: chart.sh package OUTDIR | push OUTDIR REGISTRY [--plain-http]" ;;
esac
