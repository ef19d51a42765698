#!/usr/bin/env python3
"""Precision and recall of the crash-signature classifier on every real log the checkout holds (issue 47).

Real logs, each with the verdict a careful reader gives it:
- tests/fixtures/logs/upstream/expected.tsv: logs copied from upstream issues and PRs (source cited per row);
- tests/fixtures/logs/captures.tsv: this project's own GPU / CPU captures (tests/fixtures, and shared/fixtures
  beside the checkout where not byte-identical to a committed one). Built crash sections (*.tail.log) are not
  real and are left out.

Figures (one row per log, or per log + spec where expected.tsv gives the spec the operator rendered):
- precision: of the logs where the classifier names an upstream issue, the share where that issue is the one
  the reader gives (naming one for a log whose reader gives none counts as wrong);
- recall: of the logs whose reader names an upstream issue, the share the classifier names correctly;
- signature recall: of the logs the reader gives a signature (or class) to, the share classified with it;
- crash detection: of the crash logs (known or not), the share detected as a crash whose root-cause line holds the
  reader's root cause;
- false crashes: healthy logs reported as crashes.

    .venv/bin/python bench/score_signatures.py [--operator DIR] [--list] [--json]

`--operator DIR` imports the classifier from another source root (e.g. an export of the base commit:
`mkdir DIR && git archive BASE operator | tar -x -C DIR`), so one label set scores two versions of the code.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "tests" / "fixtures" / "logs" / "upstream"
CAPTURES = ROOT / "tests" / "fixtures" / "logs" / "captures.tsv"
SHARED = Path(os.environ.get("GDN_SHARED_DIR", ROOT.parent / "shared"))


@dataclass(frozen=True)
class Case:
    path: Path
    name: str
    expect: str  # known | crash | healthy
    signature: str | None
    upstream: str | None
    root: str | None
    spec: Path | None


def _none(v: str) -> str | None:
    return None if v in ("-", "") else v


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader((ln for ln in fh if not ln.startswith("#")), delimiter="\t"))


def load_cases() -> list[Case]:
    cases = [
        Case(
            UPSTREAM / r["file"],
            r["file"] + (f"+{Path(r['spec']).stem}" if r["spec"] != "-" else ""),
            r["expect"],
            _none(r["signature"]),
            _none(r["upstream"]),
            _none(r["root_cause"]),
            UPSTREAM / r["spec"] if r["spec"] != "-" else None,
        )
        for r in _rows(UPSTREAM / "expected.tsv")
    ]
    for r in _rows(CAPTURES):
        f = r["file"]
        path = SHARED / f.removeprefix("shared/") if f.startswith("shared/") else ROOT / f
        if not path.is_file():
            print(f"skipped (not here): {f}", file=sys.stderr)
            continue
        cases.append(Case(path, f, r["expect"], _none(r["signature"]), _none(r["upstream"]), _none(r["root_cause"]), None))
    return cases


def classify(case: Case) -> Any:
    from gdn_operator.watch.evidence import Evidence
    from gdn_operator.watch.signatures import classify_text

    ev = Evidence.from_manifest(str(case.path.parent / case.spec)) if case.spec else None
    return classify_text(case.path.read_text(encoding="utf-8", errors="replace"), evidence=ev)


def score(cases: list[Case]) -> tuple[dict[str, Any], list[str]]:
    named = named_ok = with_up = up_ok = with_sig = sig_ok = crashes = crash_ok = healthy = false_crash = 0
    lines = []
    for c in cases:
        r = classify(c)
        root_ok = c.root is None or (r.root_cause is not None and c.root in r.root_cause)
        if r.upstream is not None:
            named += 1
            named_ok += r.upstream == c.upstream
        if c.upstream is not None:
            with_up += 1
            up_ok += r.upstream == c.upstream
        if c.signature is not None:
            with_sig += 1
            sig_ok += r.signature == c.signature
        if c.expect in ("known", "crash"):
            crashes += 1
            crash_ok += bool(r.crashed and root_ok)
        else:
            healthy += 1
            false_crash += bool(r.crashed)
        ok = (
            (r.upstream == c.upstream)
            and (c.signature is None or r.signature == c.signature)
            and (r.crashed == (c.expect != "healthy"))
            and (c.expect == "healthy" or root_ok)
        )
        lines.append(
            f"{'ok ' if ok else 'BAD'} {c.name[:70]:70s} want {c.expect}/{c.signature or '-'}/{c.upstream or '-'}"
            f" got {'crash' if r.crashed else 'healthy'}/{r.signature or '-'}/{r.upstream or '-'}"
        )
    s = {
        "logs": len(cases),
        "precision": named_ok / named if named else 1.0,
        "named": named,
        "named_correctly": named_ok,
        "recall": up_ok / with_up if with_up else 1.0,
        "with_upstream": with_up,
        "attributed": up_ok,
        "signature_recall": sig_ok / with_sig if with_sig else 1.0,
        "with_signature": with_sig,
        "crash_detection": crash_ok / crashes if crashes else 1.0,
        "crashes": crashes,
        "false_crashes": false_crash,
        "healthy": healthy,
    }
    return s, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--operator", type=Path, default=ROOT / "operator", help="source root holding gdn_operator")
    ap.add_argument("--list", action="store_true", help="one line per log")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(a.operator.resolve()))
    s, lines = score(load_cases())
    if a.json:
        print(json.dumps(s, indent=1))
        return 0
    if a.list:
        print("\n".join(lines))
    print(
        f"{s['logs']} real logs; precision {s['precision']:.1%} ({s['named_correctly']}/{s['named']} named correctly); "
        f"recall {s['recall']:.1%} ({s['attributed']}/{s['with_upstream']} upstream issues attributed); "
        f"signature recall {s['signature_recall']:.1%} ({s['with_signature']} labelled); "
        f"crash detection {s['crash_detection']:.1%} of {s['crashes']}; false crashes {s['false_crashes']}/{s['healthy']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
