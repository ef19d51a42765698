"""The commands README.md tells a user to run, read from README.md itself (issue 27).

A command is a line of a ```sh block (comments dropped, `\\` continuations joined), or an inline code span
that starts a script of this repository (``hack/…``, ``tests/cluster/build.sh …``, ``.venv/bin/…``,
``VENV/bin/…``) or ``helm …`` / ``kubectl …``. A bare path to a Python module or a document (`hack/tiers.py`,
`hack/gpu/README.md`) is a mention, not a command. ``key()`` is the comparison form (shell words joined).

Tests that run a README command say so with ``@pytest.mark.readme("<command as in README.md>")``;
tests/test_readme_commands.py fails when a README command has no such test (and is not one of the few
that cannot run on this machine, each with its reason).
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(sh|bash|shell)\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_STARTS = ("hack/", "tests/cluster/", ".venv/bin/", "VENV/bin/", "helm ", "kubectl ")


def key(command: str) -> str:
    """Shell words, comments dropped, joined by single spaces (quotes kept as shlex writes them)."""
    return shlex.join(shlex.split(command, comments=True))


def _is_command(span: str) -> bool:
    span = span.strip()
    if not span.startswith(_STARTS):
        return False
    first = span.split()[0]
    return " " in span or first.endswith(".sh") or first.startswith((".venv/bin/", "VENV/bin/"))


def readme_commands(text: str | None = None) -> dict[str, str]:
    """Every command in README.md, in order of appearance: ``key()`` -> the line as written (with its comment)."""
    text = README.read_text() if text is None else text
    found: dict[str, str] = {}
    for m in _FENCE.finditer(text):
        for line in m.group(2).replace("\\\n", " ").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                found.setdefault(key(line), " ".join(line.split()))
    for span in _SPAN.findall(_FENCE.sub("", text)):
        if _is_command(span):
            found.setdefault(key(span), span.strip())
    return found


def declared(tests_dir: Path = ROOT / "tests", root: Path = ROOT) -> dict[str, list[str]]:
    """``@pytest.mark.readme("…")`` declarations in the test files: command key -> ["path::test", …]."""
    out: dict[str, list[str]] = {}
    for path in sorted(tests_dir.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                if (
                    isinstance(dec, ast.Call)
                    and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == "readme"
                    and dec.args
                    and isinstance(dec.args[0], ast.Constant)
                ):
                    ref = f"{path.relative_to(root)}::{node.name}"
                    out.setdefault(key(dec.args[0].value), []).append(ref)
    return out
