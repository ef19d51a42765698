"""The one image tag scheme of gdn-operator's release artefacts (issue 39; issue 38's "one tag scheme").

  operator        ghcr.io/gdn-operator/gdn-operator:<version>           version = Chart.yaml version = appVersion
  engine, patched ghcr.io/gdn-operator/vllm-gdn:<vllm>-gdn<guard>       where a gdn-guard patch applies to <vllm>
  engine, stock   vllm/vllm-openai:v<vllm>                              wherever none does

Some guards apply to every release but only to some models (MODEL_CONDITIONAL: gdn-guard/fa3-group-metadata,
G1, for checkpoints whose attention layers form two or more KV-cache groups). They do not make a release's
recommended image the patched one — the Qwen3.5 examples need no patch at 0.33.0 — but a vllm-gdn image built for
that release carries them, and the rule that needs one names it (`engine(VERSION, conditional=True)`). A vllm-gdn
image over a release that no guard patches at all would be the stock image under another name: never built.

  python hack/release/images.py engine VERSION     print "IMAGE PATCHES" (patches comma-separated, may be empty)
  python hack/release/images.py operator           print the operator image of this checkout's version
  python hack/release/images.py matrix [FILE]      print the vllm-gdn builds of a release as JSON (the workflow's matrix;
                                                   FILE defaults to images/vllm-gdn/releases.yaml)
  python hack/release/images.py version            print this checkout's version (Chart.yaml `version`)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "images" / "gdn-guard" / "src"))

from gdn_guard import __version__ as GUARD_VERSION  # noqa: E402
from gdn_guard.plugin import declared_patch_ids  # noqa: E402

OPERATOR_REPOSITORY = "ghcr.io/gdn-operator/gdn-operator"
GDN_REPOSITORY = "ghcr.io/gdn-operator/vllm-gdn"
STOCK_REPOSITORY = "vllm/vllm-openai"
CHART_YAML = ROOT / "charts" / "gdn-operator" / "Chart.yaml"
#: vLLM releases a release of gdn-operator builds a vllm-gdn image for (each must carry a gdn-guard patch).
VLLM_GDN_RELEASES = ROOT / "images" / "vllm-gdn" / "releases.yaml"
#: guards that apply on every release, to some models only (they do not decide a release's recommended image)
MODEL_CONDITIONAL = frozenset({"gdn-guard/fa3-group-metadata"})
GDN_TAG = re.compile(r"^(?P<vllm>\d+\.\d+\.\d+)-gdn(?P<guard>\d+\.\d+\.\d+)$")


def version() -> str:
    return str(yaml.safe_load(CHART_YAML.read_text())["version"])


def gdn_tag(vllm: str) -> str:
    return f"{vllm}-gdn{GUARD_VERSION}"


def engine(vllm: str, conditional: bool = False) -> tuple[str, str, list[str]]:
    """(repository, tag, patch ids) of the image users should run for vLLM ``vllm``; ``conditional``: for a model
    a MODEL_CONDITIONAL guard applies to (a vllm-gdn image whenever the release has any patch)."""
    patches = sorted(declared_patch_ids(vllm))
    if patches and (conditional or set(patches) - MODEL_CONDITIONAL):
        return GDN_REPOSITORY, gdn_tag(vllm), patches
    return STOCK_REPOSITORY, f"v{vllm}", []


def matrix(releases: Path = VLLM_GDN_RELEASES) -> list[dict[str, str]]:
    """One entry per vLLM release in images/vllm-gdn/releases.yaml; a release without a patch is an error."""
    rows = []
    for vllm in yaml.safe_load(releases.read_text())["vllm"]:
        repo, tag, patches = engine(str(vllm), conditional=True)
        if repo != GDN_REPOSITORY:
            raise SystemExit(
                f"{releases.name}: gdn-guard {GUARD_VERSION} patches nothing on vLLM {vllm}; "
                f"remove it (users run {STOCK_REPOSITORY}:v{vllm})"
            )
        rows.append({"vllm": str(vllm), "image": f"{repo}:{tag}", "patches": ",".join(patches)})
    return rows


def main(argv: list[str]) -> int:
    match argv:
        case ["engine", vllm]:
            repo, tag, patches = engine(vllm)
            print(f"{repo}:{tag} {','.join(patches)}".rstrip())
        case ["operator"]:
            print(f"{OPERATOR_REPOSITORY}:{version()}")
        case ["matrix"]:
            print(json.dumps(matrix()))
        case ["matrix", releases]:
            print(json.dumps(matrix(Path(releases))))
        case ["version"]:
            print(version())
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
