"""The issue 36 hazards on real launch lines (tests/fixtures/logs/upstream/hazard-lines.tsv): `gdnctl validate`
raises each line's rule, and stays silent on its healthy control (the same line with the trigger changed)."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from paths import gdnctl

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "upstream" / "hazard-lines.tsv"


def rows() -> list[dict[str, str]]:
    with open(CORPUS, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader((ln for ln in fh if not ln.startswith("#")), delimiter="\t"))


ROWS = rows()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['source'].split()[0]}-{i}" for i, r in enumerate(ROWS)])
def test_real_launch_lines_raise_their_rule_and_controls_do_not(row: dict[str, str]) -> None:
    argv = [gdnctl(), "validate", "--vllm-version", row["vllm_version"], "--architecture", row["architecture"]]
    p = subprocess.run([*argv, "--output", "json", "--", *shlex.split(row["line"])], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    found = {f["rule"] for f in json.loads(p.stdout)["results"][0]["findings"]}
    if row["expect"] != "-":
        assert row["expect"] in found, found
    for rule in row["absent"].split():
        if rule != "-":
            assert rule not in found, found


def test_every_new_hazard_has_a_line_and_a_control():
    expected = {r["expect"] for r in ROWS} - {"-"}
    assert expected == {"vllm#52069", "vllm#44697", "vllm#41830"}
    controlled = {a for r in ROWS if r["expect"] == "-" for a in r["absent"].split()}
    assert {"vllm#52069", "vllm#44697", "vllm#41830"} <= controlled
