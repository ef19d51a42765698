#!/usr/bin/env bash
# Stage the bundle pieces that arrived with this copy of the checkout (GPU host side).
#   hack/gpu/stage-piece.sh SRC_DIR [STAGE_DIR]
# SRC_DIR: where the carried files lie (manifest.json + one or more pieces), e.g. .gpu-bundle/vllm-0.22.0.
# STAGE_DIR (default: ${GDN_CACHE_DIR:-~/.cache/gdn-operator}/gpu-stage/<name of SRC_DIR>, outside the
# checkout so that refreshing the checkout between copies cannot remove it):
# collects the pieces across calls.  Each piece is checked against the manifest before it is kept;
# a manifest from a different build empties the stage first.  Prints what is staged and what is still
# missing; exits 0 when the bundle is complete, 4 while pieces are missing, 2 on a bad piece.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,8p "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SRC="$1"
STAGE="${2:-${GDN_CACHE_DIR:-$HOME/.cache/gdn-operator}/gpu-stage/$(basename "$SRC")}"
[ -f "$SRC/manifest.json" ] || { echo "stage-piece: $SRC/manifest.json missing (carry it with every piece)" >&2; exit 2; }
mkdir -p "$STAGE"
PYTHONPATH="" python3 - "$SRC" "$STAGE" <<'PY'
import hashlib, json, shutil, sys
from pathlib import Path
src, stage = Path(sys.argv[1]), Path(sys.argv[2])
mf = json.loads((src / "manifest.json").read_text())
old = stage / "manifest.json"
if old.exists() and json.loads(old.read_text())["archive_sha256"] != mf["archive_sha256"]:
    print(f"stage-piece: {stage} held another build; emptied")
    shutil.rmtree(stage); stage.mkdir(parents=True)
shutil.copyfile(src / "manifest.json", old)
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for c in iter(lambda: f.read(1 << 20), b""): h.update(c)
    return h.hexdigest()
missing = []
for piece in mf["pieces"]:
    name, dst, s = piece["file"], stage / piece["file"], src / piece["file"]
    if s.is_file() and not (dst.is_file() and dst.stat().st_size == piece["bytes"]):
        if sha(s) != piece["sha256"]:
            sys.exit(f"stage-piece: {s}: sha256 differs from the manifest (copy it again)")
        shutil.copyfile(s, dst.with_suffix(".tmp")); dst.with_suffix(".tmp").rename(dst)
        print(f"stage-piece: staged {name} ({piece['bytes'] / 1e6:.1f} MB)")
    if not dst.is_file():
        missing.append(name)
print(f"stage-piece: {len(mf['pieces']) - len(missing)}/{len(mf['pieces'])} pieces in {stage}"
      + (f"; missing: {' '.join(missing)}" if missing else "; complete"))
sys.exit(4 if missing else 0)
PY
