"""The EXTRACT step of hack/vllm-release-diff.py: one vLLM release (a wheel, an unpacked wheel, or the `vllm`
package directory of one) -> the few facts this repo's catalogue and renderer depend on, as plain JSON.

Nothing is imported from the release: every fact is read from its source text with `ast` (and the wheel's
METADATA), so any release can be read on any machine, with no GPU and none of its requirements. What is read,
and from which files, is data (`watch.yaml` beside this file):

* ``flags``: every `vllm serve` option the release's own code registers: the fields of ``EngineArgs`` and the
  frontend argument dataclasses (vLLM derives one ``--field-name`` option from each), and the literal option
  strings of the ``add_argument`` calls in the files that build the parser, each with its destination and the
  default expression (``EngineArgs.x = ModelConfig.x`` is followed to ``ModelConfig.x``'s default);
* ``env``: ``vllm/envs.py``'s ``environment_variables`` (name -> the expression that reads it) and
  ``removed_environment_variables`` (name -> the hint vLLM fails with); ``env_checks``: for the watched
  variables, every ``raise`` whose text names them and the files that read them;
* ``config``: the field defaults of the watched config classes; ``constants``: their modules' UPPER_CASE
  constants;
* ``branches``: per watched topic (async scheduling, prefix caching, CUDA graphs, KV sizing, model runner,
  speculative decoding), every statement of the watched files that mentions the topic, with the chain of
  conditions it sits under (``if A / not (B) => x = y``): the config branches a default comes from;
* ``patch_targets``: the classes the gdn-guard plugin patches, and which members it needs they still have;
* ``model_runners``: the ``*ModelRunner*`` classes under ``vllm/v1/worker``, by file;
* ``metrics``: every ``vllm:`` metric name the release's code spells;
* ``requires``: the wheel's unconditional Requires-Dist pins (torch, flashinfer-python, transformers, ...).

Size (~570 lines): one reader per kind of fact (flags, environment, config, branches, patch targets, runners,
metrics, pins), each a few dozen lines, sharing one source walker; split, they would share its private helpers.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = 1
_MAX_TEXT = 240  # characters kept of one expression / statement / condition
_CONST_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
_METRIC = re.compile(r"^vllm:[a-z][a-z0-9_:]*$")


class ExtractError(Exception):
    pass


# ---------------------------------------------------------------------------------- the source ---


class Release:
    """The files of one release: `vllm/...` paths and the dist-info METADATA, from a wheel or a directory."""

    def __init__(self, path: Path):
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None
        if path.is_file() and path.suffix == ".whl":
            self._zip = zipfile.ZipFile(path)
            names = self._zip.namelist()
            self._files = sorted(n for n in names if n.startswith("vllm/") and n.endswith(".py"))
            meta = [n for n in names if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)]
            self._metadata = self._zip.read(meta[0]).decode() if meta else None
        elif path.is_dir():
            root = path.parent if path.name == "vllm" and (path / "__init__.py").exists() else path
            if not (root / "vllm").is_dir():
                raise ExtractError(f"{path}: no vllm/ package in it (give a wheel, an unpacked wheel or its vllm/ dir)")
            self._root = root
            self._files = sorted(p.relative_to(root).as_posix() for p in (root / "vllm").rglob("*.py"))
            metas = sorted(root.glob("vllm-*.dist-info/METADATA"))
            self._metadata = metas[0].read_text(encoding="utf-8") if metas else None
        else:
            raise ExtractError(f"{path}: not a .whl file or a directory")
        self._trees: dict[str, ast.Module | None] = {}

    @property
    def files(self) -> list[str]:
        return self._files

    def text(self, rel: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(rel).decode("utf-8", "replace")
            except KeyError:
                return None
        assert self._root is not None
        p = self._root / rel
        return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            text = self.text(rel)
            try:
                self._trees[rel] = ast.parse(text) if text is not None else None
            except SyntaxError:
                self._trees[rel] = None
        return self._trees[rel]

    def glob(self, pattern: str) -> list[str]:
        """Files matching a pattern of `watch.yaml` (`*` within a path part, `**` across parts)."""
        rx = re.compile("^" + re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*") + "$")
        return [f for f in self._files if rx.match(f)]

    @property
    def metadata(self) -> str | None:
        return self._metadata


def _short(text: str, limit: int = _MAX_TEXT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unparse(node: ast.AST | None, limit: int = _MAX_TEXT) -> str:
    return "<none>" if node is None else _short(ast.unparse(node), limit)


# ---------------------------------------------------------------------------------- versions ---


def release_version(rel: Release) -> str:
    if rel.metadata:
        m = re.search(r"^Version: (\S+)$", rel.metadata, re.M)
        if m:
            return m.group(1)
    text = rel.text("vllm/_version.py") or ""
    m = re.search(r"""(?:__version__|version)\s*(?::\s*str)?\s*=\s*['"]([^'"]+)['"]""", text)
    if m:
        return m.group(1).split("+", 1)[0]
    raise ExtractError(f"{rel.path}: no version (no dist-info METADATA, no vllm/_version.py)")


def requires(rel: Release) -> dict[str, str]:
    """Unconditional (no `extra ==` marker) Requires-Dist of the wheel: normalised name -> specifier[; marker]."""
    out: dict[str, str] = {}
    for line in (rel.metadata or "").splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line[len("Requires-Dist:") :].strip().partition(";")
        if "extra ==" in marker:
            continue
        m = re.match(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*(.*)", req.strip())
        if not m:
            continue
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        spec = m.group(3).strip().strip("()") + (f"; {marker.strip()}" if marker.strip() else "")
        out[name] = f"{out[name]} | {spec}" if name in out else spec
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------- class fields ---


def _classes(rel: Release, files: list[str]) -> dict[str, tuple[str, ast.ClassDef]]:
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for f in files:
        tree = rel.tree(f)
        if tree is None:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, (f, node))
    return found


def class_fields(cls: ast.ClassDef) -> dict[str, ast.expr | None]:
    """Class-level `name: T = value` / `name = value` (dataclass fields, ClassVars): name -> value node."""
    out: dict[str, ast.expr | None] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _field_default(value: ast.expr | None) -> ast.expr | None:
    """`field(default=X)` / `Field(default=X)` / `field(default_factory=F)` -> X / F(); else the value."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute):
        fname = value.func.id if isinstance(value.func, ast.Name) else value.func.attr
        if fname in ("field", "Field"):
            for kw in value.keywords:
                if kw.arg == "default":
                    return kw.value
                if kw.arg == "default_factory":
                    return ast.Call(func=kw.value, args=[], keywords=[])
            if value.args:
                return value.args[0]
    return value


class _Defaults:
    """Resolves an EngineArgs default: `ModelConfig.x` and `get_field(ModelConfig, "x")` to ModelConfig's own."""

    def __init__(self, classes: dict[str, tuple[str, ast.ClassDef]]):
        self.classes = classes

    def resolve(self, value: ast.expr | None, depth: int = 0) -> str:
        value = _field_default(value)
        if depth < 3 and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            target = self._field(value.value.id, value.attr)
            if target is not None:
                return self.resolve(target, depth + 1)
        if (
            depth < 3
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "get_field"
            and len(value.args) == 2
            and isinstance(value.args[0], ast.Name)
            and isinstance(value.args[1], ast.Constant)
        ):
            target = self._field(value.args[0].id, str(value.args[1].value))
            if target is not None:
                return self.resolve(target, depth + 1)
        return _unparse(value, 160)

    def _field(self, cls: str, name: str) -> ast.expr | None:
        if cls not in self.classes:
            return None
        fields = class_fields(self.classes[cls][1])
        return fields.get(name) if name in fields else None


# ------------------------------------------------------------------------------------- flags ---


def _kwargs_sources(func: ast.FunctionDef) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)` -> {"model_kwargs": "ModelConfig"} inside one function."""
    out: dict[str, str] = {}
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "get_kwargs"
            and node.value.args
            and isinstance(node.value.args[0], ast.Name)
        ):
            out[node.targets[0].id] = node.value.args[0].id
    return out


def _add_argument_calls(func: ast.FunctionDef) -> Iterator[tuple[list[str], tuple[str, str] | None, ast.Call]]:
    """(option strings, (kwargs variable, config field) of a `**kw["field"]`, the call) in one function."""
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        source = None
        for kw in node.keywords:
            if (
                kw.arg is None
                and isinstance(kw.value, ast.Subscript)
                and isinstance(kw.value.value, ast.Name)
                and isinstance(kw.value.slice, ast.Constant)
            ):
                source = (kw.value.value.id, str(kw.value.slice.value))
        yield strings, source, node


def _dest(options: list[str], call: ast.Call) -> str:
    """argparse's destination: `dest=`, else the first long option (else the first) with dashes made underscores."""
    for kw in call.keywords:
        if kw.arg == "dest" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    longs = [s for s in options if s.startswith("--")]
    return (longs or options)[0].lstrip("-").replace("-", "_")


def flags(rel: Release, watch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """dest -> {"options": [...], "default": text}: what `vllm serve` registers, read from the source.

    The frontend dataclasses give one `--field-name` option per field (vLLM loops over get_kwargs); the engine's
    options are the explicit `add_argument("--x", "-y", **model_kwargs["field"])` calls, whose default is the
    named config class's field (`model_kwargs = get_kwargs(ModelConfig)`)."""
    spec = watch["flags"]
    classes = _classes(rel, [f for pattern in spec["class_files"] for f in rel.glob(pattern)])
    defaults = _Defaults(classes)
    engine_fields = class_fields(classes["EngineArgs"][1]) if "EngineArgs" in classes else {}
    out: dict[str, dict[str, Any]] = {}

    for cls_name in spec["field_classes"]:
        if cls_name not in classes:
            continue
        for name, value in class_fields(classes[cls_name][1]).items():
            if not name.startswith("_") and not _CONST_NAME.match(name):
                out.setdefault(name, {"options": ["--" + name.replace("_", "-")], "default": defaults.resolve(value)})

    for pattern in spec["parser_files"]:
        for f in rel.glob(pattern):
            tree = rel.tree(f)
            if tree is None:
                continue
            for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
                sources = _kwargs_sources(func)
                for strings, source, call in _add_argument_calls(func):
                    options = [s for s in strings if s.startswith("-")]
                    if not options:
                        continue
                    dest = _dest(options, call)
                    explicit = next((kw.value for kw in call.keywords if kw.arg == "default"), None)
                    if explicit is not None:
                        default = defaults.resolve(explicit)
                    elif source is not None and source[0] in sources:
                        default = defaults.resolve(ast.Attribute(value=ast.Name(id=sources[source[0]]), attr=source[1]))
                    elif dest in engine_fields:
                        default = defaults.resolve(engine_fields[dest])
                    else:
                        default = "None"
                    entry = out.setdefault(dest, {"options": [], "default": default})
                    entry["options"] += [s for s in options if s not in entry["options"]]  # the canonical one first
    return dict(sorted(out.items()))


# -------------------------------------------------------------------------------- environment ---


def _module_dict(tree: ast.Module, name: str) -> dict[str, ast.expr]:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        value = node.value if isinstance(node, ast.AnnAssign | ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Dict):
            return {k.value: v for k, v in zip(value.keys, value.values, strict=True) if isinstance(k, ast.Constant)}
    return {}


def environment(rel: Release) -> tuple[dict[str, str], dict[str, str]]:
    tree = rel.tree("vllm/envs.py")
    if tree is None:
        return {}, {}
    env = {k: _unparse(v, 200) for k, v in _module_dict(tree, "environment_variables").items()}
    removed = {
        k: _short(ast.literal_eval(v) if isinstance(v, ast.Constant) else ast.unparse(v), 300)
        for k, v in _module_dict(tree, "removed_environment_variables").items()
    }
    return dict(sorted(env.items())), dict(sorted(removed.items()))


def env_checks(rel: Release, names: list[str]) -> dict[str, dict[str, list[str]]]:
    """For each watched variable: the files that name it, and every `raise` whose text names it."""
    out: dict[str, dict[str, list[str]]] = {n: {"files": [], "raises": []} for n in names}
    for f in rel.files:
        text = rel.text(f) or ""
        present = [n for n in names if n in text]
        if not present:
            continue
        for n in present:
            out[n]["files"].append(f)
        tree = rel.tree(f)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                src = ast.unparse(node.exc)
                for n in present:
                    if n in src:
                        out[n]["raises"].append(f"{f}: raise {_short(src, 300)}")
    for v in out.values():
        v["raises"] = sorted(set(v["raises"]))
    return out


# ------------------------------------------------------------------------- config and branches ---


def config_defaults(rel: Release, watch: dict[str, Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for entry in watch["config"]:
        for f in rel.glob(entry["file"]):
            classes = _classes(rel, [f])
            for cls_name in entry["classes"]:
                if cls_name in classes:
                    fields = class_fields(classes[cls_name][1])
                    out[f"{f}:{cls_name}"] = {k: _unparse(v, 200) for k, v in fields.items()}
    return out


def constants(rel: Release, watch: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in watch["config"]:
        for f in rel.glob(entry["file"]):
            tree = rel.tree(f)
            if tree is None:
                continue
            names = set(entry.get("names", ()))
            for node in tree.body:
                target = (
                    node.target
                    if isinstance(node, ast.AnnAssign)
                    else (node.targets[0] if isinstance(node, ast.Assign) else None)
                )
                if (
                    isinstance(target, ast.Name)
                    and (_CONST_NAME.match(target.id) or target.id in names)
                    and isinstance(node, ast.AnnAssign | ast.Assign)
                ):
                    out[f"{f}:{target.id}"] = _unparse(node.value, 400)
    return dict(sorted(out.items()))


_BODIES = ("body", "orelse", "finalbody")


def _branch_lines(stmts: list[ast.stmt], conds: list[str], pattern: re.Pattern[str], out: list[str]) -> None:
    for s in stmts:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # walked on their own (their own qualified name)
        if isinstance(s, ast.If):
            test = _unparse(s.test, 160)
            _branch_lines(s.body, [*conds, test], pattern, out)
            _branch_lines(s.orelse, [*conds, f"not ({test})"], pattern, out)
        elif isinstance(s, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith | ast.Try):
            head = {
                ast.For: lambda n: f"for {_unparse(n.target, 60)} in {_unparse(n.iter, 100)}",
                ast.AsyncFor: lambda n: f"for {_unparse(n.target, 60)} in {_unparse(n.iter, 100)}",
                ast.While: lambda n: f"while {_unparse(n.test, 160)}",
            }.get(type(s))
            inner = [*conds, head(s)] if head else conds
            for attr in _BODIES:
                _branch_lines(getattr(s, attr, []), inner, pattern, out)
            for h in getattr(s, "handlers", []):
                _branch_lines(h.body, [*conds, f"except {_unparse(h.type, 80)}"], pattern, out)
        elif isinstance(s, ast.Match):
            for case in s.cases:
                _branch_lines(case.body, [*conds, f"case {_unparse(case.pattern, 100)}"], pattern, out)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            continue  # docstrings
        else:
            text = _unparse(s)
            if pattern.search(text) or (conds and pattern.search(conds[-1])):
                out.append(" / ".join(conds) + " => " + text if conds else text)


def _scopes(tree: ast.Module) -> Iterator[tuple[str, list[ast.stmt]]]:
    """(qualified name, body) for the module, every class and every function, nested ones included."""
    yield "<module>", tree.body

    def walk(nodes: list[ast.stmt], prefix: str) -> Iterator[tuple[str, list[ast.stmt]]]:
        for node in nodes:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{node.name}"
                yield name, node.body
                yield from walk(node.body, name + ".")
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                for attr in _BODIES:
                    yield from walk(getattr(node, attr, []), prefix)

    yield from walk(tree.body, "")


def branches(rel: Release, watch: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for topic, spec in watch["branches"].items():
        pattern = re.compile(spec["pattern"])
        scopes = re.compile(spec.get("scopes", ""))
        found: dict[str, list[str]] = {}
        for glob in spec["files"]:
            for f in rel.glob(glob):
                tree = rel.tree(f)
                if tree is None or not pattern.search(rel.text(f) or ""):
                    continue
                for name, body in _scopes(tree):
                    if not scopes.match(name):
                        continue
                    lines: list[str] = []
                    _branch_lines(body, [], pattern, lines)
                    if lines:
                        found[f"{f}:{name}"] = list(dict.fromkeys(lines))
        out[topic] = dict(sorted(found.items()))
    return out


# ------------------------------------------------------------------------------ patch targets ---


def _members(cls: ast.ClassDef) -> set[str]:
    """Names a class defines: methods, class attributes, and `self.x = ...` in its methods."""
    names = set(class_fields(cls))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
    return names


def patch_targets(rel: Release, watch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each class the gdn-guard plugin patches: whether it exists, and which of the members the guard needs it
    has (its own or inherited from a base class defined in the same package tree)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in watch.get("patch_targets", []):
        f, _, cls_name = entry["target"].partition(":")
        package = f.rsplit("/", 2)[0]
        index = _classes(rel, [f, *rel.glob(package + "/**/*.py")])
        if cls_name not in index or index[cls_name][0] != f:
            out[entry["target"]] = {"exists": False, "members": []}
            continue
        have: set[str] = set()
        queue, seen = [cls_name], set()
        while queue and len(seen) < 8:
            name = queue.pop(0)
            if name in seen or name not in index:
                continue
            seen.add(name)
            cls = index[name][1]
            have |= _members(cls)
            queue += [b.id if isinstance(b, ast.Name) else b.attr for b in cls.bases if isinstance(b, ast.Name | ast.Attribute)]
        out[entry["target"]] = {"exists": True, "members": sorted(set(entry["members"]) & have)}
    return out


# ------------------------------------------------------------------------ runners and metrics ---


def model_runners(rel: Release, watch: dict[str, Any]) -> dict[str, list[str]]:
    rx = re.compile(watch["model_runners"]["class_pattern"])
    out: dict[str, list[str]] = {}
    for f in rel.glob(watch["model_runners"]["files"]):
        tree = rel.tree(f)
        if tree is None:
            continue
        names = sorted(n.name for n in tree.body if isinstance(n, ast.ClassDef) and rx.search(n.name))
        if names:
            out[f] = names
    return out


def metrics(rel: Release) -> list[str]:
    names: set[str] = set()
    for f in rel.files:
        text = rel.text(f) or ""
        if "vllm:" not in text:
            continue
        tree = rel.tree(f)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _METRIC.match(node.value):
                names.add(node.value)
    return sorted(names)


# ---------------------------------------------------------------------------------- the extract ---


def extract(path: Path, watch: dict[str, Any]) -> dict[str, Any]:
    rel = Release(path)
    env, removed = environment(rel)
    return {
        "schema": SCHEMA,
        "vllm_version": release_version(rel),
        "source": path.name,
        "extracted_by": "hack/vllm-release-diff.py --extract",
        "requires": requires(rel),
        "model_runners": model_runners(rel, watch),
        "flags": flags(rel, watch),
        "env": env,
        "env_removed": removed,
        "env_checks": env_checks(rel, sorted(watch["env"])),
        "config": config_defaults(rel, watch),
        "constants": constants(rel, watch),
        "branches": branches(rel, watch),
        "patch_targets": patch_targets(rel, watch),
        "metrics": metrics(rel),
    }
