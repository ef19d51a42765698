"""The trained tiny Qwen3-Next recall model (issue 13): where it is, its held-out set, and scoring.

One home for what the engine tests, ``bench/bench_cpu_mtp.py`` and ``hack/dev.sh --real-model`` share:

- ``MODEL_DIR`` / ``BROKEN_MTP_DIR``: the committed model dir and its broken-MTP-head variant;
- ``load_heldout()``: the held-out prompts (``heldout.jsonl``);
- ``complete_many()``: send prompts to an OpenAI-compatible ``/v1/completions`` endpoint concurrently
  (greedy; token-id or text prompts), returning the generated token ids and text;
- ``score()``: token-level and sequence-level exactness against the expected continuations.

Stdlib only (runs in the project venv and the engine venv alike).
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny-qwen3-next-recall"
BROKEN_MTP_DIR = HERE / "tiny-qwen3-next-recall-broken-mtp"
EOS_TOKEN_ID = 1
FIRST_SYMBOL_ID = 4  # ids 4..65 are the 62 symbols 0-9a-zA-Z (tests/models/train_recall.py)


def load_heldout(model_dir: Path = MODEL_DIR) -> list[dict]:
    path = model_dir / "heldout.jsonl"
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not items:
        raise ValueError(f"{path}: no held-out prompts")
    return items


@dataclass
class Completion:
    id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None


def complete(base_url: str, model: str, item: dict, *, text_prompt: bool = False, timeout: float = 300.0) -> Completion:
    """One greedy completion; ``return_token_ids`` makes vLLM report the generated ids."""
    body = {
        "model": model,
        "prompt": item["prompt"] if text_prompt else item["prompt_token_ids"],
        "max_tokens": item["max_tokens"],
        "temperature": 0.0,
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        choice = json.loads(resp.read())["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        raise RuntimeError("the engine returned no token_ids: does it support return_token_ids?")
    return Completion(item["id"], list(ids), choice.get("text") or "", choice.get("finish_reason"))


def complete_many(
    base_url: str, model: str, items: list[dict], *, concurrency: int = 16, text_prompt: bool = False
) -> list[Completion]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda it: complete(base_url, model, it, text_prompt=text_prompt), items))


@dataclass
class Score:
    tokens: int  # expected tokens in all
    correct: int  # expected tokens produced at the right place
    exact: int  # sequences whose answer equals the expected continuation exactly
    sequences: int
    mismatches: list[str]  # ids of the sequences that differ

    @property
    def token_accuracy(self) -> float:
        return self.correct / self.tokens if self.tokens else 0.0

    @property
    def exact_share(self) -> float:
        return self.exact / self.sequences if self.sequences else 0.0


def score(items: list[dict], outs: list[Completion]) -> Score:
    """Position-wise comparison of the generated ids (EOS dropped) with ``expected_token_ids``.

    A sequence is exact when the ids equal the expected ones and the text equals ``expected``."""
    by_id = {o.id: o for o in outs}
    tokens = correct = exact = 0
    bad = []
    for it in items:
        exp = it["expected_token_ids"]
        out = by_id[it["id"]]
        got = [t for t in out.token_ids if t != EOS_TOKEN_ID]
        tokens += len(exp)
        correct += sum(1 for a, b in zip(got, exp) if a == b)
        if got == exp and out.text == it["expected"]:
            exact += 1
        else:
            bad.append(it["id"])
    return Score(tokens, correct, exact, len(items), bad)
