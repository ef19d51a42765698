"""handlers/core/kube.py is the one module that talks to the API server: every helper it offers has a caller
(a helper nobody calls is an untested way to write to the cluster — issue 38 found a spec-writing one)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "gdn_operator"
KUBE = PACKAGE / "handlers" / "core" / "kube.py"


def _referenced(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return names | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_every_public_kube_helper_has_a_caller():
    tree = ast.parse(KUBE.read_text(), str(KUBE))
    public = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        used |= _referenced(path)  # kube.py's own calls count (a call is a reference; a def is not)
    unused = [name for name in public if name not in used]
    assert len(public) > 10 and not unused, f"helpers in handlers/core/kube.py nobody calls: {unused}"


def test_the_operator_has_no_helper_that_writes_a_servers_spec():
    text = KUBE.read_text()
    assert "merge-patch+json" not in text, "the operator never writes a GDNModelServer's spec (overrides live in status)"


def test_plain_copies_deeply_whatever_it_is_given():
    """kube.plain: a kopf Body view, a plain dict, lists and tuples become plain dicts and lists, deeply (an edit of
    the copy changes nothing of the original); kube.plain_object also leaves metadata.managedFields out."""
    import kopf

    from gdn_operator.handlers.core import kube

    raw = {
        "metadata": {"name": "s", "labels": {"a": "b"}, "managedFields": [{"manager": "m"}]},
        "spec": {"args": ["--x", 1, 2.5, True, None], "nested": [{"k": ("t", "u")}]},
    }
    for given in (raw, kopf.Body(raw)):
        out = kube.plain(given)
        assert type(out) is dict and out["spec"]["nested"][0]["k"] == ["t", "u"]
        out["spec"]["args"].append("--y")
        out["metadata"]["labels"]["a"] = "c"
        assert raw["spec"]["args"] == ["--x", 1, 2.5, True, None] and raw["metadata"]["labels"] == {"a": "b"}
        obj = kube.plain_object(given)
        assert obj["metadata"] == {"name": "s", "labels": {"a": "b"}} and obj["spec"]["args"] == raw["spec"]["args"]
        obj["spec"]["nested"][0]["k"].append("v")
        assert raw["spec"]["nested"][0]["k"] == ("t", "u")
