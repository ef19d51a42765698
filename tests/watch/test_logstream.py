"""Bounded streaming classifier (gdn_operator/watch/logstream.py).

Streams are the real 0.32.0 startup log plus tens of MB of steady-state serving lines in the same
formats (tests/fixtures/logs/gdn_log_noise.py), with a crash section from tests/fixtures/logs at the end,
fed in random-size byte chunks.
"""

from __future__ import annotations

import random
import sys
import tracemalloc
from pathlib import Path

import pytest

from gdn_operator.watch.logstream import StreamClassifier, classify_termination_message
from gdn_operator.watch.signatures import CONTEXT_LINE_CHARS, CONTEXT_LINES, MAX_LINE_CHARS, classify_text

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
sys.path.insert(0, str(LOGS))
import gdn_log_noise  # noqa: E402

MB = 1 << 20


def tail(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def feed_random(sc: StreamClassifier, data: bytes, rnd: random.Random, max_chunk: int) -> None:
    i = 0
    while i < len(data):
        n = rnd.randint(1, max_chunk)
        sc.feed(data[i : i + n])
        i += n


def assert_bounded(sc: StreamClassifier) -> None:
    st = sc.buffer_stats()
    assert st["partial_chars"] <= MAX_LINE_CHARS
    assert st["max_partial_seen"] <= MAX_LINE_CHARS
    assert st["decoder_pending_bytes"] <= 3
    assert st["tail_lines"] <= CONTEXT_LINES
    assert st["tail_chars"] <= CONTEXT_LINES * CONTEXT_LINE_CHARS
    # per signature: one context snapshot plus a few matched lines, whatever the input size
    assert st["state_chars"] <= 64 * (CONTEXT_LINES + 4) * CONTEXT_LINE_CHARS + 64 * MAX_LINE_CHARS


@pytest.fixture(scope="module")
def big_log() -> str:
    """>= 20 MB: real startup + serving noise + the B1 TP crash (ANSI, interleaved workers) at the end."""
    text = gdn_log_noise.noise_text(20 * MB, seed=1) + tail("b1-gdn-assert-tp2-interleaved.tail.log")
    assert len(text.encode()) >= 20 * MB
    return text


def test_big_stream_random_chunks_equals_one_shot(big_log: str) -> None:
    one_shot = classify_text(big_log)
    assert one_shot.signature == "gdn-mixed-spec-decode-assert"
    assert one_shot.root_cause == "AssertionError: num_decodes: 1, num_spec_decodes: 7"
    data = big_log.encode()
    rnd = random.Random(7)
    sc = StreamClassifier()
    i = 0
    while i < len(data):
        n = rnd.choice([rnd.randint(1, 64), rnd.randint(1, 4096), rnd.randint(1, 2 * MB)])
        sc.feed(data[i : i + n])
        i += n
        assert_bounded(sc)
    sc.close()
    assert sc.result().to_dict() == one_shot.to_dict()
    assert sc.lines_scanned == big_log.count("\n")


def test_big_noise_alone_is_not_a_crash(big_log: str) -> None:
    noise = big_log[: big_log.index("\x1b[1;36m(Worker_TP0")]
    sc = StreamClassifier()
    feed_random(sc, noise.encode(), random.Random(3), 3 * MB)
    sc.close()
    assert not sc.result().crashed


def test_memory_stays_bounded_over_a_long_stream() -> None:
    """40 MB produced lazily: peak traced memory stays far below the stream size."""
    tracemalloc.start()
    try:
        sc = StreamClassifier()
        total = 0
        for chunk in gdn_log_noise.noise_chunks(40 * MB, seed=2, chunk_bytes=MB):
            sc.feed(chunk)
            total += len(chunk)
            assert_bounded(sc)
        sc.feed(tail("cpu-align-kernel.tail.log").encode())
        sc.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total >= 40 * MB
    assert sc.result().signature == "cpu-align-kernel-unsupported"
    # a 1 MB chunk lives in the generator, the decoded copy and one slice: a few MB, not 40
    assert peak < 12 * MB, peak


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.tail.log")))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_crash_log_chunking_invariant(name: str, seed: int) -> None:
    text = gdn_log_noise.startup_head() + tail(name)
    one = classify_text(text)
    sc = StreamClassifier()
    feed_random(sc, text.encode(), random.Random(seed), 97)
    sc.close()
    assert sc.result().to_dict() == one.to_dict()


def test_multibyte_utf8_split_across_chunks() -> None:
    # the real banner has 3-byte box characters; feed one byte at a time
    text = gdn_log_noise.startup_head() + "AssertionError: num_decodes: 1, num_spec_decodes: 7 \u2584\u2588\n"
    data = text.encode()
    assert any(b >= 0x80 for b in data)
    sc = StreamClassifier()
    for i in range(len(data)):
        sc.feed(data[i : i + 1])
    sc.close()
    r = sc.result()
    assert r.signature == "gdn-mixed-spec-decode-assert"
    assert r.root_cause.endswith("\u2584\u2588")
    assert r.to_dict() == classify_text(text).to_dict()


def test_invalid_utf8_does_not_break_matching() -> None:
    data = (
        b"\xff\xfe garbage \xc3\x28 \xe2\x82\n"
        + b"(Worker_TP0 pid=1) ERROR 01-01 00:00:00 [multiproc_executor.py:880] AssertionError: num_decodes: 3, num_spec_decodes: 1 \xed\xa0\x80\n"
        + b"\x80\x81\x82 EngineDeadError\n"
    )
    sc = StreamClassifier()
    feed_random(sc, data, random.Random(1), 5)
    sc.close()
    r = sc.result()
    assert r.signature == "gdn-mixed-spec-decode-assert"
    assert r.root_cause.startswith("AssertionError: num_decodes: 3, num_spec_decodes: 1")
    assert r.other_signatures == ["engine-dead"]


def test_over_long_line_is_capped_and_stream_continues() -> None:
    sc = StreamClassifier()
    # 30 MB without a newline, a crash string beyond the cap, fed in 1 MB pieces
    piece = b"x" * MB
    sc.feed(b"AssertionError is not here; ")
    for _ in range(30):
        sc.feed(piece)
        assert sc.buffer_stats()["partial_chars"] <= MAX_LINE_CHARS
    sc.feed(b"EngineDeadError beyond the cap\n")
    assert not sc.crashed  # only the first 8 KiB of a line are matched
    sc.feed(b"(EngineCore pid=2) ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.\n")
    assert sc.crashed
    sc.close()
    r = sc.result()
    assert r.signature == "engine-dead"
    assert r.root_cause_line == 2 and sc.lines_scanned == 2
    assert sc.buffer_stats()["max_partial_seen"] == MAX_LINE_CHARS


def test_partial_last_line_counts_only_after_close() -> None:
    sc = StreamClassifier()
    sc.feed("INFO fine\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    assert not sc.crashed  # the line may still be growing
    sc.close()
    assert sc.crashed and sc.result().root_cause_line == 2
    with pytest.raises(RuntimeError):
        sc.feed(b"more")
    sc.reset()
    assert not sc.crashed and sc.lines_scanned == 0
    sc.feed(b"AssertionError: num_decodes: 1, num_spec_decodes: 2\n")
    assert sc.result().signature == "gdn-mixed-spec-decode-assert"


def test_crash_detected_mid_stream_before_close(big_log: str) -> None:
    head = gdn_log_noise.noise_text(2 * MB, seed=4)
    sc = StreamClassifier()
    sc.feed(head.encode())
    assert not sc.crashed
    sc.feed(tail("b4-illegal-address-accepted-sync-tp2.tail.log").encode())
    assert sc.crashed
    assert sc.result().signature == "cuda-illegal-address-accepted-sync"
    assert sc.result().upstream == "vllm#41190"


def test_small_block_size_gives_same_result() -> None:
    text = gdn_log_noise.noise_text(300_000, seed=9) + tail("b6-gdn-attn-237.tail.log")
    a = StreamClassifier(block_chars=4096)
    a.feed(text.encode())
    a.close()
    b = StreamClassifier()
    b.feed(text)  # str input
    b.close()
    assert a.result().to_dict() == b.result().to_dict() == classify_text(text).to_dict()


def test_termination_message_helper_reexported() -> None:
    r = classify_termination_message(tail("b9-np-repeat-negative.tail.log")[-2048:])
    assert r.signature == "spec-decode-negative-repeat"
