"""One image tag scheme everywhere (issue 39 item 4, issue 38's "one image tag scheme with a test").

hack/release/images.py is the scheme: ghcr.io/gdn-operator/vllm-gdn:<vllm>-gdn<gdn-guard version> only for a vLLM
release gdn-guard patches (images/vllm-gdn/releases.yaml, built by the release workflow), the stock
vllm/vllm-openai:v<vllm> everywhere else. Every image users are told to run follows it: the examples, the
README's manifests, the chart's NOTES, the Dockerfile's build lines and the rules' fix texts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
import yaml

from images_env import REPO

spec = importlib.util.spec_from_file_location("release_images", REPO / "hack" / "release" / "images.py")
assert spec and spec.loader
images = importlib.util.module_from_spec(spec)
sys.modules["release_images"] = images
spec.loader.exec_module(images)

from gdn_guard import __version__ as GUARD_VERSION  # noqa: E402
from gdn_guard.plugin import declared_patch_ids  # noqa: E402

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
IMAGE_REF = re.compile(r"\b(ghcr\.io/gdn-operator/vllm-gdn|vllm/vllm-openai):([A-Za-z0-9._-]+)")


def _check(repository: str, tag: str, vllm: str, patches: list[str], where: str) -> None:
    want_repo, want_tag, want_patches = images.engine(vllm)
    assert (repository, tag) == (want_repo, want_tag), (
        f"{where}: vLLM {vllm} runs {want_repo}:{want_tag} (gdn-guard patches there: {want_patches or 'none'}), "
        f"not {repository}:{tag}"
    )
    if repository == images.GDN_REPOSITORY:
        assert sorted(patches) == want_patches, f"{where}: spec.image.patches must be {want_patches}"


def test_scheme_stock_image_without_a_patch_and_vllm_gdn_only_with_one():
    # 0.33.0: only the model-conditional G1 guard (two attention KV-cache groups): the release's image stays stock,
    # a model G1 applies to runs vllm-gdn
    assert declared_patch_ids("0.33.0") == ["gdn-guard/fa3-group-metadata"]
    assert images.engine("0.33.0") == ("vllm/vllm-openai", "v0.33.0", [])
    assert images.engine("0.33.0", conditional=True) == (
        "ghcr.io/gdn-operator/vllm-gdn",
        f"0.33.0-gdn{GUARD_VERSION}",
        ["gdn-guard/fa3-group-metadata"],
    )
    assert images.engine("0.17.1") == (
        "ghcr.io/gdn-operator/vllm-gdn",
        f"0.17.1-gdn{GUARD_VERSION}",
        ["gdn-guard/fa3-group-metadata", "gdn-guard/vllm-36917"],
    )
    m = images.GDN_TAG.match(images.gdn_tag("0.17.1"))
    assert m and (m["vllm"], m["guard"]) == ("0.17.1", GUARD_VERSION)
    assert not images.GDN_TAG.match("v0.33.0-gdn1"), "the tag of earlier examples, never built, is not the scheme"


def test_every_vllm_gdn_release_the_workflow_builds_carries_a_patch(tmp_path):
    rows = images.matrix()
    assert rows, "images/vllm-gdn/releases.yaml lists no release"
    for row in rows:
        assert declared_patch_ids(row["vllm"]), row
        assert row["image"] == f"ghcr.io/gdn-operator/vllm-gdn:{images.gdn_tag(row['vllm'])}"
        assert row["patches"] == ",".join(sorted(declared_patch_ids(row["vllm"])))
    # a release only a model-conditional guard patches is built too (for the models it applies to)
    only = tmp_path / "releases.yaml"
    only.write_text("vllm: [0.33.0]\n")
    res = subprocess.run(
        [sys.executable, str(REPO / "hack" / "release" / "images.py"), "matrix", str(only)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [
        {
            "vllm": "0.33.0",
            "image": f"ghcr.io/gdn-operator/vllm-gdn:0.33.0-gdn{GUARD_VERSION}",
            "patches": "gdn-guard/fa3-group-metadata",
        }
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_run_images_of_the_scheme(path):
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "GDNModelServer":
            continue
        img = doc["spec"]["image"]
        _check(img["repository"], img["tag"], str(img["vllmVersion"]), img.get("patches") or [], path.name)


def test_readme_manifests_run_images_of_the_scheme():
    text = (REPO / "README.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)]
    checked = 0
    for doc in blocks:
        img = ((doc or {}).get("spec") or {}).get("image") if isinstance(doc, dict) else None
        if isinstance(img, dict) and "repository" in img and "tag" in img:
            _check(img["repository"], img["tag"], str(img["vllmVersion"]), img.get("patches") or [], "README.md")
            checked += 1
    assert checked, "README.md shows no GDNModelServer with an image"
    for repo, tag in IMAGE_REF.findall(text):
        if repo == images.GDN_REPOSITORY:
            assert images.GDN_TAG.match(tag), f"README.md names {repo}:{tag}, not <vllm>-gdn<guard>"


def test_chart_notes_and_dockerfile_name_only_scheme_images():
    notes = (REPO / "charts" / "gdn-operator" / "templates" / "NOTES.txt").read_text()
    assert "examples/qwen3.5-27b-mtp.yaml" in notes and "v0.33.0-gdn1" not in notes
    assert "v{{ .Chart.Version }}/examples/" in notes, "NOTES must point at the examples of the installed release"
    dockerfile = (REPO / "images" / "vllm-gdn" / "Dockerfile").read_text()
    refs = IMAGE_REF.findall(dockerfile)
    built = [(r, t) for r, t in refs if r == images.GDN_REPOSITORY]
    assert built, "the Dockerfile's build line names no vllm-gdn tag"
    for _, tag in built:
        m = images.GDN_TAG.match(tag)
        assert m and m["guard"] == GUARD_VERSION and declared_patch_ids(m["vllm"]), tag
    assert 'org.opencontainers.image.version="${VLLM_VERSION}-gdn${GDN_GUARD_VERSION}"' in dockerfile
    assert f"ARG GDN_GUARD_VERSION={GUARD_VERSION}" in dockerfile


def test_rules_with_a_shipped_patch_name_the_image_that_carries_it():
    data = yaml.safe_load((REPO / "operator" / "gdn_operator" / "rules" / "data" / "rules.yaml").read_text())
    shipped = set(data["patches"])
    named = 0
    for rule in data["rules"]:
        for patch in set(rule.get("patches") or []) & shipped:
            refs = [t for r, t in IMAGE_REF.findall(rule.get("workaround", "")) if r == images.GDN_REPOSITORY]
            assert refs, f"{rule['id']}: its fix {patch} ships in an image the workaround does not name"
            for tag in refs:
                m = images.GDN_TAG.match(tag)
                assert m and patch in declared_patch_ids(m["vllm"]), f"{rule['id']}: {tag} does not carry {patch}"
            named += 1
    assert named, "no rule lists a shipped patch"


def test_the_test_builders_flagship_image_follows_the_scheme():
    from builders import GDN_IMAGE

    _check(GDN_IMAGE["repository"], GDN_IMAGE["tag"], GDN_IMAGE["vllmVersion"], [], "tests/builders.py GDN_IMAGE")
