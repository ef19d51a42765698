"""gdn_operator.datafiles: data files parsed by a safe loader, and loaders that compute once even when many
threads ask at the same moment (the operator's API workers in its first burst after start)."""

from __future__ import annotations

import threading
import time
from importlib import resources

import pytest
import yaml

from gdn_operator import datafiles
from gdn_operator.api import vllm_args
from gdn_operator.datafiles import load_yaml, once


def test_concurrent_first_calls_compute_once():
    calls = []
    gate = threading.Event()

    @once
    def load(name: str) -> dict:
        calls.append(name)
        gate.wait(5)  # hold the first computation until every thread has asked
        return {"name": name}

    got: list[dict] = []
    threads = [threading.Thread(target=lambda: got.append(load("t"))) for _ in range(32)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == ["t"]
    assert len(got) == 32 and all(g is got[0] for g in got)


def test_values_are_kept_per_argument_and_cleared_on_request():
    calls = []

    @once
    def load(version: str, *, strict: bool = False) -> tuple[str, bool]:
        calls.append((version, strict))
        return version, strict

    assert load("0.22.0") == ("0.22.0", False)
    assert load("0.22.0") == ("0.22.0", False)
    assert load("0.32.0", strict=True) == ("0.32.0", True)
    assert calls == [("0.22.0", False), ("0.32.0", True)]
    load.cache_clear()
    load("0.22.0")
    assert calls[-1] == ("0.22.0", False) and len(calls) == 3


def test_an_exception_is_not_cached():
    attempts = []

    @once
    def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("not yet")
        return 7

    with pytest.raises(OSError, match="not yet"):
        flaky()
    assert flaky() == 7 and flaky() == 7 and len(attempts) == 2


def test_load_yaml_is_a_safe_loader():
    assert load_yaml("a: [1, 2]\nb: {c: x}\n") == {"a": [1, 2], "b": {"c": "x"}}
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")
    with pytest.raises(yaml.YAMLError):
        load_yaml("a: [1, 2\n")


def test_packaged_data_files_parse_the_same_with_either_loader():
    """The C and the pure-Python safe loaders agree on every data file the package ships."""
    root = resources.files("gdn_operator")
    files = [p for p in _walk(root) if p.name.endswith(".yaml")]
    names = {f.name for f in files}
    assert {"rules.yaml", "signatures.yaml", "extra-args-policy.yaml", "checkpoints.yaml", "hang-evidence.yaml"} <= names
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert load_yaml(text) == yaml.load(text, Loader=yaml.SafeLoader), f.name  # noqa: S506


def _walk(node):
    for child in node.iterdir():
        if child.is_dir():
            yield from _walk(child)
        else:
            yield child


def test_the_option_table_is_built_once_per_release():
    vllm_args.load_table.cache_clear()
    (version,) = vllm_args.table_versions()[-1:]
    tables = []
    threads = [threading.Thread(target=lambda: tables.append(vllm_args.load_table(version))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(tables) == 16 and all(t is tables[0] for t in tables)
    assert datafiles._LOADER in (getattr(yaml, "CSafeLoader", None), yaml.SafeLoader)
