#!/usr/bin/env python3
"""What changed between two vLLM releases in everything this repo's catalogue and renderer depend on.

    .venv/bin/python hack/vllm-release-diff.py OLD NEW [--json]
    .venv/bin/python hack/vllm-release-diff.py --extract RELEASE [-o FILE]

OLD / NEW: a release wheel (.whl), an unpacked wheel (the directory holding vllm/ and its dist-info), the
vllm/ package directory itself, an extract (.json, from --extract), or a version whose extract is committed
(`0.34.0` -> tests/fixtures/vllm-release-extracts/0.34.0.json).

Two steps: EXTRACT reads one release's source, statically (hack/vllm_release/extract.py: nothing of vLLM is
imported, no GPU, none of its requirements), into a small JSON of the facts hack/vllm_release/watch.yaml names:
`vllm serve` options and defaults, environment variables and the checks that name them, config defaults and the
branches they come from (async scheduling, prefix caching, CUDA graphs incl. breakable graphs, KV sizing, model
runner, hybrid models, MTP), the model runners, the classes gdn-guard patches, metric names, and the wheel's pins.
DIFF (hack/vllm_release/report.py) compares two extracts and names, for each change, the rules, render paths,
tables and remedies of this repo that read it. docs/adding-a-vllm-release.md is the checklist this drives.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_release import extract, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WATCH = Path(__file__).resolve().parent / "vllm_release" / "watch.yaml"
EXTRACTS = ROOT / "tests" / "fixtures" / "vllm-release-extracts"


def load_watch() -> dict:
    with open(WATCH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load(source: str, watch: dict) -> dict:
    """An extract: read from a .json file or a committed version, or made from a wheel / directory."""
    path = Path(source)
    if not path.exists() and (EXTRACTS / f"{source}.json").exists():
        path = EXTRACTS / f"{source}.json"
    if path.suffix == ".json" and path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != extract.SCHEMA:
            raise extract.ExtractError(
                f"{path}: extract schema {data.get('schema')}, this tool reads {extract.SCHEMA}; re-extract"
            )
        return data
    if not path.exists():
        raise extract.ExtractError(f"{source}: no such file or directory, and no committed extract {EXTRACTS.name}/{source}.json")
    return extract.extract(path, watch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="vllm-release-diff.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("releases", nargs="*", metavar="OLD NEW")
    ap.add_argument("--extract", metavar="RELEASE", help="write the extract of one release (JSON) and stop")
    ap.add_argument("-o", "--output", type=Path, help="with --extract: the file to write (default: stdout)")
    ap.add_argument("--json", action="store_true", help="the report as JSON (every change, with its consumers)")
    args = ap.parse_args(argv)
    watch = load_watch()
    try:
        if args.extract:
            text = json.dumps(load(args.extract, watch), indent=1, sort_keys=True) + "\n"
            if args.output:
                args.output.write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
            return 0
        if len(args.releases) != 2:
            ap.error("give OLD and NEW (or --extract RELEASE)")
        old, new = (load(s, watch) for s in args.releases)
    except extract.ExtractError as e:
        print(f"vllm-release-diff: {e}", file=sys.stderr)
        return 2
    changes = report.diff(old, new, report.Repo(watch))
    sys.stdout.write(report.render_json(old, new, changes) if args.json else report.render_text(old, new, changes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
