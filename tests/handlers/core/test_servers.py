"""handlers/core/servers.py, the one door to a GDNModelServer (issue 37): one owner per status key (STATUS, found in
the source like conditions.CONDITIONS), and the door's cache: newest body kept, fresh reads only on request."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import gdn_operator
from gdn_operator.api.status import GDNModelServerStatus
from gdn_operator.handlers.core import servers as door
from gdn_operator.handlers.core import statusguard

PKG = Path(gdn_operator.__file__).resolve().parent
#: the code that writes a server's status dict (a variable named `status`): the handlers, and the one API module
#: that edits it (the overrides; api/crd.py's `status` is a schema, not a status)
#: modules writing another resource's status (a GDNGuard's: handlers/guard/status.py is its one writer, checked below)
OTHER_RESOURCES = {PKG / "handlers" / "guard" / "status.py"}
#: the neutral conditions-list writer: it writes the `conditions` of the status its caller hands it, a server's only
#: through handlers/core/conditions.py (its only callers are that module and the guard's status: checked below)
NEUTRAL = PKG / "handlers" / "core" / "condition_list.py"
SCANNED = sorted({*(PKG / "handlers").rglob("*.py"), PKG / "api" / "overrides.py"} - OTHER_RESOURCES - {NEUTRAL})


def _imports(path: Path) -> set[str]:
    """The modules `path` imports (`from a.b import c` as a.b and a.b.c, `import a.b` as a.b)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def _key(node: ast.expr, module: object) -> str | None:
    """The status key an index or argument names: a string, or a module constant (OWNED_KINDS, CLEARED_KEY)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return str(getattr(module, node.id))
    return None


def _is_status(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "status"


def status_writes(path: Path) -> list[tuple[str, int]]:
    """(key, line) of every write of a status key in `path`: `status[k] = ...` (also in tuple targets),
    `del status[k]`, `status.pop(k)`, `status.setdefault(k, ...)`, `status.__setitem__(k, ...)`."""
    rel = path.relative_to(PKG).with_suffix("")
    module = importlib.import_module("gdn_operator." + ".".join(rel.parts))
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            for t in node.targets:
                targets += t.elts if isinstance(t, ast.Tuple) else [t]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and _is_status(t.value):
                key = _key(t.slice, module)
                assert key is not None, f"{rel}:{t.lineno}: a status key the scan cannot read; use a literal or a constant"
                out.append((key, t.lineno))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_status(node.func.value)
            and node.func.attr in ("pop", "setdefault", "__setitem__", "__delitem__", "update")
        ):
            assert node.func.attr != "update", f"{rel}:{node.lineno}: status.update() hides which keys it writes"
            key = _key(node.args[0], module)
            assert key is not None, f"{rel}:{node.lineno}: a status key the scan cannot read"
            out.append((key, node.lineno))
    return out


def test_every_status_key_has_one_writer_the_status_table_names():
    found: dict[str, set[str]] = {}
    for path in SCANNED:
        for key, _line in status_writes(path):
            found.setdefault(key, set()).add(str(path.relative_to(PKG)))
    wrong = {k: sorted(mods) for k, mods in found.items() if k not in door.STATUS or mods != {door.STATUS[k][0]}}
    assert wrong == {}, "status keys written outside their owner (handlers/core/servers.py STATUS)"
    assert sorted(found) == sorted(door.STATUS), "a key in STATUS that nothing writes"


def test_the_guard_status_writer_writes_only_guard_status_keys():
    """handlers/guard/status.py writes GDNGuard status (its keys are that schema's), and no other module does."""
    from gdn_operator.api.guard import GDNGuardStatus

    # its conditions through the neutral writer, never the server's (which sets a phase and derives Degraded, issue 49)
    imported = _imports(PKG / "handlers" / "guard" / "status.py")
    assert "gdn_operator.handlers.core.condition_list" in imported
    assert not {m for m in imported if m.startswith("gdn_operator.handlers.core.conditions")}
    keys = {k for k, _ in status_writes(PKG / "handlers" / "guard" / "status.py")}
    schema = {f.alias or name for name, f in GDNGuardStatus.model_fields.items()}
    assert keys and keys <= schema, keys - schema
    guard_only = schema - {f.alias or name for name, f in GDNModelServerStatus.model_fields.items()}
    for path in SCANNED:
        assert not guard_only & {k for k, _ in status_writes(path)}, path


def test_the_neutral_condition_writer_writes_a_server_status_only_through_conditions():
    """condition_list.py is left out of the scan above: only handlers/core/conditions.py (a server's, with its phase and
    Degraded) and handlers/guard/status.py (a guard's) call it."""
    callers = {
        str(path.relative_to(PKG))
        for path in (PKG / "handlers").rglob("*.py")
        if "gdn_operator.handlers.core.condition_list" in _imports(path)
    }
    assert callers == {"handlers/core/conditions.py", "handlers/guard/status.py"}


def test_the_status_table_covers_the_status_schema():
    schema = {f.alias or name for name, f in GDNModelServerStatus.model_fields.items()}
    assert set(door.STATUS) == schema
    for writer, _what in door.STATUS.values():
        assert (PKG / writer).is_file(), writer


def test_the_scan_finds_a_write_outside_the_owner():
    """The scan is not blind: a second writer of `workload` (the key reconcile.py used to write too) is found."""
    src = (PKG / "handlers" / "server" / "workloadstatus.py").read_text()
    assert ("workload", next(i for i, line in enumerate(src.splitlines(), 1) if "status[WORKLOAD] = dep" in line)) in (
        status_writes(PKG / "handlers" / "server" / "workloadstatus.py")
    )
    keys = [k for k, _ in status_writes(PKG / "handlers" / "server" / "reconcile.py")]
    assert "workload" not in keys and "overrides" not in keys and {"observedGeneration", "ownedKinds", "url"} <= set(keys)


def _body(rv: str, uid: str = "u1", phase: str = "Pending") -> dict:
    return {"metadata": {"namespace": "ns", "name": "s", "uid": uid, "resourceVersion": rv}, "status": {"phase": phase}}


def test_the_newest_body_is_kept_and_reads_happen_only_when_asked(monkeypatch):
    reads: list[str] = []
    monkeypatch.setattr(statusguard, "get_server", lambda ns, name: reads.append(name) or _body("9", phase="Read"))
    s = door.Servers()
    s.put(_body("5", phase="Five"))
    s.put(_body("4", phase="Four"))  # an older version arriving late is not kept
    assert s.get("ns", "s")["status"]["phase"] == "Five"
    assert s.current("ns", "s")["status"]["phase"] == "Five" and reads == []  # cache first
    assert s.get("ns", "s", uid="other") is None  # a body of an earlier object of that name
    assert s.read("ns", "s")["status"]["phase"] == "Read" and reads == ["s"]  # fresh when asked
    assert s.get("ns", "s")["status"]["phase"] == "Read"  # and remembered
    s.forget("ns", "s")
    assert s.current("ns", "s")["status"]["phase"] == "Read" and reads == ["s", "s"]  # nothing held: one read


def test_the_door_keeps_and_hands_out_copies_without_managed_fields():
    """What put() keeps and get() hands out are deep copies (a caller's edit of either changes neither), without
    metadata.managedFields (no handler reads them; they are most of a body)."""
    body = _body("5")
    body["metadata"]["managedFields"] = [{"manager": "m", "fieldsV1": {"f:spec": {}}}]
    body["status"]["conditions"] = [{"type": "Validated", "status": "True"}]
    s = door.Servers()
    s.put(body)
    body["status"]["conditions"][0]["status"] = "False"  # the caller's edit after put
    held = s.get("ns", "s")
    assert "managedFields" not in held["metadata"] and held["status"]["conditions"][0]["status"] == "True"
    held["status"]["conditions"].append({"type": "Ready"})  # the reader's edit
    assert s.get("ns", "s")["status"]["conditions"] == [{"type": "Validated", "status": "True"}]


@pytest.mark.parametrize("held_newer", [True, False])
def test_a_status_write_starts_from_the_newest_body(monkeypatch, held_newer):
    seen: list[str] = []

    def update(ns, name, mutate, retries=8, obj=None):
        seen.append(obj["metadata"]["resourceVersion"])
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": "20"}}

    monkeypatch.setattr(statusguard, "update_status", update)
    s = door.Servers()
    s.put(_body("7" if held_newer else "3"))
    out = s.update_status("ns", "s", lambda status, _o: None, obj=_body("5"))
    assert seen == (["7"] if held_newer else ["5"])
    assert out["metadata"]["resourceVersion"] == "20" and s.get("ns", "s")["metadata"]["resourceVersion"] == "20"
