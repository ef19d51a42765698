"""Bounded incremental crash classifier for streamed container logs (`kubectl logs -f` equivalent).

    sc = StreamClassifier()
    async for chunk in stream:          # bytes or str, any size, split anywhere
        sc.feed(chunk)
        if sc.crashed: ...              # react early
    sc.close()                          # end of stream: the last line without '\\n' counts
    result = sc.result()                # ClassificationResult (signatures.py)

Memory stays bounded however long the stream runs:
  * a partial line carried between chunks is kept only up to `max_line_chars` characters; the rest of
    an over-long line is dropped until its newline (lines are matched on their first 8 KiB);
  * bytes are decoded incrementally (a multi-byte UTF-8 character split across chunks is joined;
    invalid bytes become U+FFFD), so the decoder holds at most 3 pending bytes;
  * large chunks are processed in slices of `block_chars`, so no per-chunk copy grows with the input;
  * the classifier core keeps a fixed number of context lines and one record per catalogue signature.
`buffer_stats()` reports the sizes so tests (and the operator's debug endpoint) can check the bound.
"""

from __future__ import annotations

import codecs
from typing import Any

from gdn_operator.watch.catalogue import Catalogue
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.hang import HangEvidence
from gdn_operator.watch.result import ClassificationResult
from gdn_operator.watch.signatures import (
    MAX_LINE_CHARS,
    LogClassifier,
    classify_termination_message,
)

__all__ = ["StreamClassifier", "classify_termination_message", "DEFAULT_BLOCK_CHARS"]

#: Complete lines are handed to the classifier in blocks of about this many characters.
DEFAULT_BLOCK_CHARS = 1 << 20


class StreamClassifier:
    def __init__(
        self,
        catalogue: Catalogue | None = None,
        *,
        max_line_chars: int = MAX_LINE_CHARS,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        evidence: Evidence | None = None,
    ):
        if max_line_chars < 1 or block_chars < 1:
            raise ValueError("max_line_chars and block_chars must be positive")
        self._catalogue = catalogue
        self.max_line_chars = max_line_chars
        self.block_chars = block_chars
        self.evidence = evidence  # facts from the server's spec (watch/evidence.py)
        self.reset()

    def reset(self) -> None:
        """Forget everything (call when the container restarts and a new log begins)."""
        self._core = LogClassifier(self._catalogue, max_line_chars=self.max_line_chars, evidence=self.evidence)
        #: hang wording seen (watch/hang.py): evidence attached to a stall, never a crash
        self.hang = HangEvidence()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""  # start of the current line, at most max_line_chars characters
        self._dropping = False  # the current line is over-long: skip until its newline
        self._closed = False
        self.bytes_fed = 0
        self.max_partial_seen = 0

    # ------------------------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview | str) -> None:
        """Feed the next piece of the stream (bytes are UTF-8 decoded; str is taken as is)."""
        if self._closed:
            raise RuntimeError("StreamClassifier.feed() after close(); call reset() for a new stream")
        if isinstance(data, str):
            self.bytes_fed += len(data)
            self._feed_str(data)
            return
        mv = memoryview(data)
        self.bytes_fed += mv.nbytes
        step = self.block_chars
        for off in range(0, mv.nbytes, step):
            self._feed_str(self._decoder.decode(mv[off : off + step]))

    def close(self) -> None:
        """End of stream: flush the decoder and classify a last line that has no newline."""
        if self._closed:
            return
        rest = self._decoder.decode(b"", final=True)
        if rest:
            self._feed_str(rest)
        if self._partial:
            self._lines(self._partial)
        self._partial = ""
        self._dropping = False
        self._closed = True

    # ------------------------------------------------------------------------------------------
    def _feed_str(self, s: str) -> None:
        step = self.block_chars
        if len(s) > step:
            for off in range(0, len(s), step):
                self._feed_str(s[off : off + step])
            return
        last_nl = s.rfind("\n")
        if last_nl == -1:
            self._extend_partial(s)
            return
        if self._partial or self._dropping:
            # finish the carried line with s[:first newline], then the complete lines of s after it
            nl = s.find("\n")
            self._extend_partial(s[:nl])
            head = self._partial
            self._partial = ""
            self._dropping = False
            self._lines(head + s[nl : last_nl + 1])
        else:
            self._lines(s[: last_nl + 1])
        if last_nl + 1 < len(s):
            self._extend_partial(s[last_nl + 1 :])

    def _lines(self, text: str) -> None:
        self._core.feed_text(text)
        self.hang.feed_text(text)

    def _extend_partial(self, piece: str) -> None:
        if self._dropping:
            return
        room = self.max_line_chars - len(self._partial)
        if len(piece) >= room:
            # keep exactly the first max_line_chars characters; LogClassifier cuts lines the same way
            self._partial += piece[:room]
            self._dropping = len(piece) > room
        else:
            self._partial += piece
        if len(self._partial) > self.max_partial_seen:
            self.max_partial_seen = len(self._partial)

    # ------------------------------------------------------------------------------------------
    @property
    def crashed(self) -> bool:
        return self._core.crashed

    @property
    def lines_scanned(self) -> int:
        return self._core.lines_scanned

    def result(self, evidence: Evidence | None = None) -> ClassificationResult:
        """Classification of everything fed so far (a pending partial line is not included until close()).

        `evidence` overrides the constructor's (e.g. the spec known only when the container died)."""
        return self._core.result(evidence)

    def buffer_stats(self) -> dict[str, Any]:
        """Sizes of every buffer that grows with input; all are bounded by constants."""
        core = self._core
        ctx = sum(len(x) for x in core._tail)
        fires = 0
        for st in core._states:
            if st.fire is not None:
                fires += sum(len(c) for c in st.fire.context) + sum(len(t) for _, t in st.fire.matched)
            for last in st.last:
                fires += sum(len(x[1]) for x in last if x is not None)
        if core._last_exc is not None:
            fires += len(core._last_exc.text) + sum(len(c) for c in core._last_exc.context)
        if core._death_root is not None:
            fires += len(core._death_root[1]) + sum(len(c) for c in core._death_root[2])
        return {
            "partial_chars": len(self._partial),
            "max_partial_seen": self.max_partial_seen,
            "decoder_pending_bytes": len(self._decoder.getstate()[0]),
            "tail_lines": len(core._tail),
            "tail_chars": ctx,
            "state_chars": fires,
            "bytes_fed": self.bytes_fed,
            "lines_scanned": core.lines_scanned,
        }
