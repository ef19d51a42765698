"""Release notes of one version, cut from CHANGELOG.md (Keep a Changelog): the release workflow's notes step.

  python hack/release/notes.py VERSION [CHANGELOG]     print the body of "## [VERSION] - DATE"

Fails, naming the fix, when the section is missing, still titled Unreleased, undated or empty, so a tag cannot
publish a release without its changelog entry.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+))?$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def notes(version: str, changelog: Path) -> str:
    lines = changelog.read_text().splitlines()
    start = None
    for i, line in enumerate(lines):
        m = HEADING.match(line)
        if m and m["version"] == version:
            if not (m["date"] and DATE.match(m["date"])):
                raise SystemExit(f"notes.py: {changelog.name}: '{line}' has no release date; write '## [{version}] - YYYY-MM-DD'")
            start = i + 1
            break
    if start is None:
        raise SystemExit(
            f"notes.py: {changelog.name} has no section '## [{version}] - YYYY-MM-DD'; move the Unreleased entries "
            "under it before tagging"
        )
    end = next((j for j in range(start, len(lines)) if lines[j].startswith("## ") or lines[j].startswith("[")), len(lines))
    body = "\n".join(lines[start:end]).strip()
    if not body:
        raise SystemExit(f"notes.py: {changelog.name}: the section of {version} is empty")
    return body


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    print(notes(argv[0], Path(argv[1]) if len(argv) == 2 else ROOT / "CHANGELOG.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
