"""SBOM (CycloneDX 1.5 JSON) of the operator's Python environment: the release workflow's SBOM step for the
operator's installed packages (.github/workflows/release.yml attaches it to the release and, as a cosign
attestation, to the operator image; the images' own SBOMs come from syft there). Run as is by
tests/hack/test_release.py against this checkout's .venv.

  python hack/release/sbom.py PYTHON OUT.json

PYTHON is the command of the interpreter of the environment to describe, split like a shell word list (the
workflow: "docker run --rm --entrypoint /opt/gdn-operator/bin/python IMAGE", the image's own environment). Every
installed distribution becomes one component with its PyPI package URL; the environment must contain
gdn-operator itself, at this checkout's version (Chart.yaml), or the script fails naming both.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_YAML = ROOT / "charts" / "gdn-operator" / "Chart.yaml"

# Runs inside the described environment: name, version and licence of every installed distribution.
_LIST = """
import json
from importlib.metadata import distributions
out = {}
for d in distributions():
    name = d.metadata["Name"]
    if name:
        out[name.lower().replace("_", "-")] = {"name": name, "version": d.version, "license": d.metadata.get("License") or ""}
print(json.dumps(sorted(out.values(), key=lambda x: x["name"].lower())))
"""


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{name.lower().replace('_', '-')}@{version}"


def bom(python: str) -> dict[str, object]:
    res = subprocess.run([*shlex.split(python), "-c", _LIST], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"sbom.py: {python} could not list its distributions:\n{res.stderr[-2000:]}")
    dists = json.loads(res.stdout)
    version = str(yaml.safe_load(CHART_YAML.read_text())["version"])
    own = next((d for d in dists if d["name"].lower() == "gdn-operator"), None)
    if own is None or own["version"] != version:
        have = own["version"] if own else "not installed"
        raise SystemExit(f"sbom.py: gdn-operator in {python} is {have}; this checkout is {version} (Chart.yaml)")
    components = []
    for d in dists:
        if d["name"].lower() == "gdn-operator":
            continue
        c: dict[str, object] = {
            "type": "library",
            "bom-ref": purl(d["name"], d["version"]),
            "name": d["name"],
            "version": d["version"],
            "purl": purl(d["name"], d["version"]),
        }
        if d["license"] and len(d["license"]) < 100:
            c["licenses"] = [{"license": {"name": d["license"]}}]
        components.append(c)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "gdn-operator hack/release/sbom.py"}]},
            "component": {
                "type": "application",
                "bom-ref": purl("gdn-operator", version),
                "name": "gdn-operator",
                "version": version,
                "purl": purl("gdn-operator", version),
            },
        },
        "components": components,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    doc = bom(argv[0])
    Path(argv[1]).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"sbom.py: {len(doc['components'])} components (gdn-operator {doc['metadata']['component']['version']}) -> {argv[1]}")  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
