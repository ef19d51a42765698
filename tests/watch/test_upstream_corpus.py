"""The classifier scored on real logs copied from upstream issues and PRs (tests/fixtures/logs/upstream).

Each log's source (issue / PR number) and the verdict a careful reader gives it are in expected.tsv:
  expect = known    a catalogued crash whose log (or the spec given in the `spec` column) carries the
                    evidence that ties it to its upstream issue: the signature and upstream must match;
           crash    a crash that names no upstream issue (not catalogued, or the evidence is missing):
                    it must be detected, with the root-cause line, and no upstream issue named;
           healthy  no crash (ERROR lines of handled request errors are not deaths).
Thresholds (issue 16): 100 % precision of upstream attribution (no wrong issue named, ever), >= 90 %
recall of catalogued crashes, >= 90 % of other crashes detected with the right root-cause line, 0 false
crashes on healthy logs. The score table is printed (also: `python tests/watch/test_upstream_corpus.py`).

launchlines.tsv (issue 26): real launch lines from upstream threads and the model family `gdnctl validate`
decides for each, with the source that decides it (rules/family.py's order); a line whose family no source
reveals stays "cannot tell" (exit 2), never guessed.
"""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "upstream"
if __name__ == "__main__":  # pragma: no cover - script mode
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))

from gdn_operator.watch.evidence import Evidence  # noqa: E402
from paths import gdnctl  # noqa: E402
from gdn_operator.watch.signatures import ClassificationResult, classify_text  # noqa: E402


@dataclass(frozen=True)
class Row:
    file: str
    source: str
    cls: str
    expect: str
    signature: str | None
    upstream: str | None
    root: str | None
    spec: str | None

    @property
    def id(self) -> str:
        return self.file + (f"+{Path(self.spec).stem}" if self.spec else "")


def _none(v: str) -> str | None:
    return None if v == "-" else v


def load_rows() -> list[Row]:
    with open(CORPUS / "expected.tsv", encoding="utf-8", newline="") as fh:
        return [
            Row(
                r["file"],
                r["source"],
                r["class"],
                r["expect"],
                _none(r["signature"]),
                _none(r["upstream"]),
                _none(r["root_cause"]),
                _none(r["spec"]),
            )
            for r in csv.DictReader(fh, delimiter="\t")
        ]


ROWS = load_rows()


def classify(row: Row) -> ClassificationResult:
    ev = Evidence.from_manifest(str(CORPUS / row.spec)) if row.spec else None
    return classify_text((CORPUS / row.file).read_text(encoding="utf-8"), evidence=ev)


def verdict(row: Row, r: ClassificationResult) -> dict[str, bool]:
    root_ok = row.root is None or (r.root_cause is not None and row.root in r.root_cause)
    return {
        "named_wrong": r.upstream is not None and r.upstream != row.upstream,
        "named": r.upstream is not None,
        "known_ok": row.expect == "known" and r.signature == row.signature and r.upstream == row.upstream,
        "crash_ok": row.expect == "crash" and r.crashed and root_ok and r.upstream is None,
        "false_crash": row.expect == "healthy" and r.crashed,
        "exact": r.signature == row.signature
        and r.upstream == row.upstream
        and root_ok
        and r.crashed is (row.expect != "healthy"),
    }


def score() -> tuple[dict[str, float], list[str]]:
    per_class: dict[str, list[bool]] = defaultdict(list)
    named = wrong = known = known_ok = crash = crash_ok = healthy = false_crash = 0
    for row in ROWS:
        v = verdict(row, classify(row))
        per_class[row.cls].append(v["exact"])
        named += v["named"]
        wrong += v["named_wrong"]
        known += row.expect == "known"
        known_ok += v["known_ok"]
        crash += row.expect == "crash"
        crash_ok += v["crash_ok"]
        healthy += row.expect == "healthy"
        false_crash += v["false_crash"]
    s = {
        "precision": (named - wrong) / named if named else 1.0,
        "named": named,
        "recall_known": known_ok / known if known else 1.0,
        "crash_detected_root": crash_ok / crash if crash else 1.0,
        "false_crashes": false_crash,
    }
    lines = [
        f"upstream corpus: {len(ROWS)} cases ({len({r.file for r in ROWS})} logs)",
        f"{'class':30s} {'cases':>5s} {'exact':>6s}",
    ]
    for cls in sorted(per_class):
        oks = per_class[cls]
        lines.append(f"{cls:30s} {len(oks):5d} {sum(oks):6d}")
    lines += [
        f"precision of upstream attribution: {s['precision']:.0%} ({named - wrong}/{named} named correctly)",
        f"recall of catalogued crashes:      {s['recall_known']:.0%} ({known_ok}/{known})",
        f"other crashes found with root cause: {s['crash_detected_root']:.0%} ({crash_ok}/{crash})",
        f"false crashes on healthy logs:     {false_crash}/{healthy}",
    ]
    return s, lines


def test_corpus_is_big_and_sourced() -> None:
    logs = {r.file for r in ROWS}
    assert len(logs) >= 40
    assert logs == {p.name for p in CORPUS.glob("*.log")}, "every log has a row in expected.tsv and vice versa"
    for r in ROWS:
        assert "#" in r.source, f"{r.file}: source must be an issue/PR reference"
        assert r.expect in ("known", "crash", "healthy")
        if r.expect == "known":
            assert r.upstream and r.signature
        if r.expect != "known":
            assert r.upstream is None
    kinds = {r.expect for r in ROWS}
    assert kinds == {"known", "crash", "healthy"}


def test_corpus_score_meets_thresholds(capsys) -> None:
    s, lines = score()
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert s["precision"] == 1.0
    assert s["recall_known"] >= 0.90
    assert s["crash_detected_root"] >= 0.90
    assert s["false_crashes"] == 0


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_never_names_a_wrong_upstream_issue(row: Row) -> None:
    r = classify(row)
    assert r.upstream is None or r.upstream == row.upstream, (row.source, r.summary(), r.attribution)
    if r.upstream is None and r.crashed and r.candidates:
        assert r.remediation is not None and r.remediation.action == "investigate"  # no automatic remediation


def test_root_cause_line_points_into_the_log() -> None:
    for row in ROWS:
        r = classify(row)
        if not r.crashed:
            continue
        lines = (CORPUS / row.file).read_text(encoding="utf-8").split("\n")
        assert r.root_cause.split()[0] in lines[r.root_cause_line - 1], row.file


def load_launch_lines() -> list[dict[str, str]]:
    with open(CORPUS / "launchlines.tsv", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader((ln for ln in fh if not ln.startswith("#")), delimiter="\t"))


LAUNCH_LINES = load_launch_lines()


@pytest.mark.parametrize("row", LAUNCH_LINES, ids=[f"{r['source'].split()[0]}-{i}" for i, r in enumerate(LAUNCH_LINES)])
def test_validate_decides_the_family_of_real_launch_lines(row: dict[str, str], tmp_path: Path) -> None:
    assert "#" in row["source"]
    line = row["line"]
    if row["config"] != "-":
        model_dir = tmp_path / "checkpoint"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps({"architectures": [row["config"]]}), encoding="utf-8")
        line = line.replace("MODEL_DIR", str(model_dir))
    p = subprocess.run(
        [gdnctl(), "validate", "--vllm-version", row["vllm_version"], "--output", "json", "--", *shlex.split(line)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if row["family"] == "cannot-tell":
        assert p.returncode == 2 and p.stderr.startswith("error: cannot tell:"), (p.returncode, p.stderr)
        return
    assert p.returncode in (0, 1), p.stderr
    effective = json.loads(p.stdout)["results"][0]["effectiveDetail"]
    assert effective["architecture"] == row["family"], effective
    assert effective["sources"]["architecture"].startswith(
        {"model name": "inferred from model name", "config.json": "config.json at"}.get(row["decided_by"], row["decided_by"])
    ), effective["sources"]


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(score()[1]))
