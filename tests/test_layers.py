"""The layering contract ([tool.importlinter] in pyproject.toml, run by hack/test.sh after mypy) holds for the
real tree, and fails when an import goes up: each case copies the package, adds one upward import, and runs
lint-imports on the copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(project: Path, source_root: Path) -> subprocess.CompletedProcess[str]:
    # ahead of the editable install's path entry; wide, so that an import chain is printed on one line
    env = {**os.environ, "PYTHONPATH": str(source_root), "COLUMNS": "400"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(project / "pyproject.toml")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract():
    r = lint_imports(ROOT, ROOT / "operator")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "10 kept, 0 broken" in r.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        # the package layers: api (bottom) importing handlers (top)
        (
            "api/base.py",
            "from gdn_operator.handlers.core import kube",
            "gdn_operator.api.base -> gdn_operator.handlers.core.kube",
        ),
        # watch beside render: neither imports the other
        ("watch/groups.py", "from gdn_operator.render import lws", "gdn_operator.watch.groups -> gdn_operator.render.lws"),
        # the floors of handlers/: a feature module importing the runtime (the composition root)
        (
            "handlers/server/workload.py",
            "from gdn_operator.handlers.runtime import Runtime",
            "gdn_operator.handlers.server.workload -> gdn_operator.handlers.runtime",
        ),
        # the wings (issue 49): the guard path and the server path are siblings, neither imports the other
        (
            "handlers/guard/supervisor.py",
            "from gdn_operator.handlers.server.reconcile import reconcile_sync",
            "gdn_operator.handlers.guard.supervisor -> gdn_operator.handlers.server.reconcile",
        ),
        # ... the engine watch serves both paths and never imports one
        (
            "handlers/engines/quiet.py",
            "from gdn_operator.handlers.server.workload import on_deployment",
            "gdn_operator.handlers.engines.quiet -> gdn_operator.handlers.server.workload",
        ),
        # ... and inside a wing its floors hold: the crash watch is fanned out to by main.py, not called by the stall
        # watch below it
        (
            "handlers/engines/stall.py",
            "from gdn_operator.handlers.engines.crashwatch import on_pod_event",
            "gdn_operator.handlers.engines.stall -> gdn_operator.handlers.engines.crashwatch",
        ),
        # ... or the shared decision importing a feature
        (
            "handlers/core/plan.py",
            "from gdn_operator.handlers.server.reconcile import reconcile_sync",
            "gdn_operator.handlers.core.plan -> gdn_operator.handlers.server.reconcile",
        ),
        # one door to a server (issue 37): a feature writing status past handlers/core/servers.py, even on a floor above
        (
            "handlers/engines/quiet.py",
            "from gdn_operator.handlers.core.statusguard import update_status",
            "gdn_operator.handlers.engines.quiet -> gdn_operator.handlers.core.statusguard",
        ),
        # only the cluster-access modules import the Kubernetes client (issue 49): not the engine watch, even for an
        # exception it could catch from handlers/core/kube.py ...
        ("handlers/engines/stall.py", "import kubernetes", "gdn_operator.handlers.engines.stall -> kubernetes"),
        # ... nor a guard module beside handlers/guard/client.py, the guard's one way to the cluster
        (
            "handlers/guard/owners.py",
            "from kubernetes.client.exceptions import ApiException",
            "gdn_operator.handlers.guard.owners -> kubernetes",
        ),
        # nothing below handlers/ talks to the cluster, also not lazily inside a function
        (
            "render/engine.py",
            "def _client():\n    import kubernetes\n    return kubernetes",
            "gdn_operator.render.engine -> kubernetes",
        ),
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, line, broken):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "operator" / "gdn_operator"
    shutil.copytree(ROOT / "operator" / "gdn_operator", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    target = pkg / module
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    r = lint_imports(tmp_path, tmp_path / "operator")
    assert r.returncode != 0, r.stdout[-4000:]
    assert broken in r.stdout, r.stdout[-4000:]
    assert "0 broken" not in r.stdout


@pytest.mark.parametrize("where", ["handlers/newfeature.py", "handlers/guard/newfeature.py", "handlers/core/newfeature.py"])
def test_a_handlers_module_without_a_floor_breaks_the_contract(tmp_path, where):
    """The handlers/ floors are exhaustive (issues 37, 49): a new module, at the top or in a wing, must take its place
    in the list."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "operator" / "gdn_operator"
    shutil.copytree(ROOT / "operator" / "gdn_operator", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / where).write_text("from gdn_operator.handlers.core import tasks\n")
    r = lint_imports(tmp_path, tmp_path / "operator")
    assert r.returncode != 0, r.stdout[-4000:]
    module = "gdn_operator." + where.removesuffix(".py").replace("/", ".")
    assert module in r.stdout + r.stderr, r.stdout[-4000:]
