"""Shared helpers for the Helm chart tests: tool paths, `helm template` rendering, value sets."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gdn-operator"
CI_VALUES = CHART / "ci"
GENERATED_CRD = CHART / "files" / "crds" / "gdnmodelservers.serving.gdn-operator.io.yaml"
GENERATED_GUARD_CRD = CHART / "files" / "crds" / "gdnguards.serving.gdn-operator.io.yaml"
DASHBOARD = CHART / "files" / "dashboards" / "gdn-operator.json"
RELEASE = "gdn"
NAMESPACE = "gdn-system"

#: The feature-flag value sets every render/lint/dry-run test covers (name -> values files).
VALUE_SETS: dict[str, list[Path]] = {
    "default": [],
    "certmanager": [CI_VALUES / "certmanager-values.yaml"],
    "namespaced": [CI_VALUES / "namespaced-values.yaml"],
    "monitoring": [CI_VALUES / "monitoring-values.yaml"],
    "single-replica": [CI_VALUES / "single-replica-values.yaml"],
}


class ToolError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def tools() -> dict[str, str]:
    """helm, kubectl and promtool, installed (idempotently) by hack/tools.sh."""
    res = subprocess.run(["bash", str(ROOT / "hack" / "tools.sh")], capture_output=True, text=True)
    if res.returncode != 0:
        raise ToolError(f"hack/tools.sh failed:\n{res.stderr[-3000:]}")
    kv = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    out = {"helm": kv["HELM"], "kubectl": kv["KUBECTL"], "promtool": kv["PROMTOOL"]}
    for name, path in out.items():
        if not Path(path).is_file():
            raise ToolError(f"{name} not found at {path!r} after hack/tools.sh")
    return out


def helm(*args: str, check: bool = True, kubeconfig: str | None = None) -> subprocess.CompletedProcess:
    argv = [tools()["helm"], *args]
    if kubeconfig:
        argv += ["--kubeconfig", kubeconfig]
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ToolError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr}")
    return res


def value_args(files: list[Path] = (), sets: dict[str, Any] | None = None) -> list[str]:
    """-f for each file, --set-json for each override (so 1.5 stays a number and "5" a string)."""
    args: list[str] = []
    for f in files:
        args += ["-f", str(f)]
    for k, v in (sets or {}).items():
        args += ["--set-json", f"{k}={json.dumps(v)}"]
    return args


def render_text(
    files: list[Path] = (),
    sets: dict[str, Any] | None = None,
    *,
    include_crds: bool = False,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> str:
    args = ["template", release, str(CHART), "-n", namespace, *value_args(files, sets)]
    if include_crds:
        args.append("--include-crds")
    return helm(*args).stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@functools.cache
def _render_cached(key: str, include_crds: bool) -> str:
    return render_text(VALUE_SETS[key], include_crds=include_crds)


def render_set(name: str, include_crds: bool = False, *, hooks: bool = False) -> list[dict[str, Any]]:
    """The objects a value set installs; `hooks`: also the `helm test` hook objects (templates/tests/), which
    exist only while `helm test` runs."""
    objs = docs(_render_cached(name, include_crds))
    return objs if hooks else [o for o in objs if "helm.sh/hook" not in ((o.get("metadata") or {}).get("annotations") or {})]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = one(objs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


def env_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objs)["env"]}
