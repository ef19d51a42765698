#!/usr/bin/env python3
"""Summarise a py-spy `--format raw` recording (collapsed stacks: "frame;frame;... count" per line).

    .venv/bin/python bench/pyspy_top.py OUT.txt [--top 25] [--match gdn_operator]

Prints, over all samples (with `--idle` recordings these include waiting threads, so the numbers are
wall-time shares per thread, not CPU):
  * samples per thread (the thread name py-spy put first in each stack);
  * the top frames by self samples (the leaf of each stack);
  * the top frames by inclusive samples (anywhere in a stack, counted once per stack);
  * with --match, the top frames by inclusive samples among frames whose text contains the string
    (e.g. the operator's own functions), which shows which of our calls the time sits under.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# "func (path/to/file.py:123)" → drop the line number so one function is one row
_LINE = re.compile(r":\d+\)$")


def frame_key(frame: str) -> str:
    return _LINE.sub(")", frame.strip())


def read(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        stacks.append((stack.split(";"), int(n)))
    return stacks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="", help="also rank frames containing this text by inclusive samples")
    args = ap.parse_args()
    stacks = read(args.raw)
    total = sum(n for _, n in stacks)
    if not total:
        print(f"{args.raw}: no samples", file=sys.stderr)
        return 1
    threads: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    mine: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        threads[frames[0]] += n
        keys = [frame_key(f) for f in frames[1:]] or ["(no frame)"]
        self_[keys[-1]] += n
        for k in set(keys):
            incl[k] += n
            if args.match and args.match in k:
                mine[k] += n

    def show(title: str, c: collections.Counter[str]) -> None:
        print(f"\n== {title} (of {total} samples)")
        for k, n in c.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {n:7d}  {k[:160]}")

    show("samples per thread", threads)
    show("self (leaf frame)", self_)
    show("inclusive", incl)
    if args.match:
        show(f"inclusive, frames matching {args.match!r}", mine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
