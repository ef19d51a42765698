#!/usr/bin/env python3
"""GPU host client: does a prompt (or final prefill chunk) of exactly 1 + k tokens lose its GDN state? (issue 47,
rule vllm#53051)

Talks to engines already serving the trained tiny recall model (tests/models/tiny-qwen3-next-recall: a prompt is n
symbols then `=`, i.e. n + 1 tokens; the answer is the same n symbols then EOS, so every answer is known without a
reference). Requests go one at a time (a lone request makes the step's shape exactly its own), greedy.

  fresh sweep   prompt lengths 2 .. k + 6, `--per-length` random strings each: on an affected engine (V1 runner or
                V2 before 0.28.0, FULL CUDA graphs, MTP k) only length k + 1 is wrong
  chunk sweep   with `--chunk C` (the engine's --max-num-batched-tokens; MTP reserves no drafting slots, so a lone
                request's first chunk is C): lengths C - 2 .. C + k + 4; only C + k + 1 is wrong on an affected engine

With `--reference-url` (an MTP-off engine of the same model) every answer is also compared with the reference's.

    python3 bench/probe_gpu_k1.py --url http://127.0.0.1:18000 --model tiny --k 2 --label mtp-full \\
        [--chunk 128] [--reference-url http://127.0.0.1:18001] --out $OUT/k1-mtp-full.json

The JSON: {label, k, chunk, lengths: {L: {sent, exact, same_as_reference, wrong_examples}}, suspect: [L...]} where
`suspect` lists the lengths whose exact share is below `--threshold` (0.9).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))

from recall import EOS_TOKEN_ID, FIRST_SYMBOL_ID, complete  # noqa: E402

EQUALS_ID = 3  # `=` in the recall model's tokenizer
SYMBOLS = 62  # ids FIRST_SYMBOL_ID .. FIRST_SYMBOL_ID + 61


def recall_item(length: int, rng: random.Random, tag: str) -> dict:
    """A recall prompt of exactly `length` tokens (length - 1 symbols, then `=`) and its known answer."""
    if length < 2:
        raise ValueError("a recall prompt needs at least one symbol and `=`")
    symbols = [FIRST_SYMBOL_ID + rng.randrange(SYMBOLS) for _ in range(length - 1)]
    return {
        "id": f"{tag}-len{length}-{rng.randrange(10**9)}",
        "prompt_token_ids": [*symbols, EQUALS_ID],
        "expected_token_ids": symbols,
        "max_tokens": len(symbols) + 1,
    }


def sweep_lengths(k: int, chunk: int | None) -> list[int]:
    lengths = list(range(2, k + 7))
    if chunk:
        lengths += [n for n in range(chunk - 2, chunk + k + 5) if n not in lengths]
    return lengths


def judge(item: dict, got: list[int]) -> bool:
    return [t for t in got if t != EOS_TOKEN_ID] == item["expected_token_ids"]


def summarise(rows: dict[int, dict], threshold: float) -> list[int]:
    return sorted(n for n, r in rows.items() if r["sent"] and r["exact"] / r["sent"] < threshold)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--k", type=int, required=True, help="num_speculative_tokens of the engine under test")
    ap.add_argument("--chunk", type=int, default=None, help="the engine's --max-num-batched-tokens (chunk sweep)")
    ap.add_argument("--reference-url", default=None)
    ap.add_argument("--reference-model", default=None)
    ap.add_argument("--per-length", type=int, default=20)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--label", default="engine")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    rows: dict[int, dict] = {}
    for length in sweep_lengths(a.k, a.chunk):
        per = a.per_length if length <= a.k + 6 else max(3, a.per_length // 4)
        row = {"sent": 0, "exact": 0, "same_as_reference": None, "wrong_examples": []}
        same = 0
        for _ in range(per):
            item = recall_item(length, rng, a.label)
            out = complete(a.url, a.model, item)
            ok = judge(item, out.token_ids)
            row["sent"] += 1
            row["exact"] += ok
            if not ok and len(row["wrong_examples"]) < 3:
                row["wrong_examples"].append(
                    {"prompt": item["prompt_token_ids"], "got": out.token_ids, "finish_reason": out.finish_reason}
                )
            if a.reference_url:
                ref = complete(a.reference_url, a.reference_model or a.model, item)
                same += ref.token_ids == out.token_ids
        if a.reference_url:
            row["same_as_reference"] = same
        rows[length] = row
        print(f"{a.label} len={length}: {row['exact']}/{row['sent']} exact", file=sys.stderr, flush=True)
    doc = {
        "label": a.label,
        "k": a.k,
        "chunk": a.chunk,
        "url": a.url,
        "lengths": {str(n): r for n, r in rows.items()},
        "suspect": summarise(rows, a.threshold),
    }
    a.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"label": a.label, "suspect": doc["suspect"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
