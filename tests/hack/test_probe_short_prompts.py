"""bench/probe_gpu_short_prompts.py's arithmetic (issue 47, vllm#53051): the prompts it sends have exactly the token
counts it claims, and its tally counts an answer exact only when it is the task's answer then a stop, and as agreeing
only when it is the reference engine's answer to the same prompt."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import probe_gpu_short_prompts as probe  # noqa: E402


def test_prompts_have_the_lengths_they_claim_and_their_answers():
    short = probe.prompts(range(1, 6), 3, seed=1)
    assert [it["length"] for it in short] == [L for L in range(1, 6) for _ in range(3)]
    for it in short:
        assert len(it["prompt_token_ids"]) == it["length"] and it["prompt_token_ids"][-1] == probe.EQUALS
        assert it["expected_token_ids"] == it["prompt_token_ids"][:-1] and it["max_tokens"] == it["length"]
    chunk = probe.prompts(range(1, 4), 2, seed=2, pad=64)
    assert [len(it["prompt_token_ids"]) for it in chunk] == [65, 65, 66, 66, 67, 67]  # the final chunk is L tokens
    assert probe.prompts(range(1, 6), 3, seed=1) == short  # seeded: every engine gets the same list


def test_tally_counts_exact_and_agreement_separately():
    items = probe.prompts(range(3, 4), 4, seed=3)
    right = [{"token_ids": [*it["expected_token_ids"], probe.EOS_TOKEN_ID], "finish_reason": "stop"} for it in items]
    wrong = dict(right[1], token_ids=[9, 9, probe.EOS_TOKEN_ID])
    cut = dict(right[2], finish_reason="length")  # the right tokens without the stop: not exact
    got = [right[0], wrong, cut, {"error": "OSError: refused"}]
    rows = probe.tally(items, got, ref=right)
    assert rows == {"3": {"sent": 4, "exact": 1, "agree": 2, "errors": 1}}
    # a reference that is wrong the same way agrees: agreement is with the reference, not with the task
    assert probe.tally(items, [wrong] * 4, ref=[wrong] * 4)["3"] == {"sent": 4, "exact": 0, "agree": 4, "errors": 0}
    assert probe.tally(items, right, ref=None)["3"]["agree"] == 0  # no reference (the reference engine itself)
