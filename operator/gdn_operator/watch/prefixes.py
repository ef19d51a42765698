"""Log-line prefixes: what wraps a vLLM log line before the text a signature is matched on.

    parse_line(raw) -> Line(level, payload, proc, src)
    strip_prefixes(raw) -> (level, payload)

Handled, in any combination (each form is one seen in real upstream logs; tests/fixtures/logs/upstream):
  * ANSI colour: real ESC sequences, and the forms that survive copy/paste or `cat -v`: `^[[1;36m`,
    `ESC[1;36m`, and ` [36m` with the ESC byte lost; a trailing `^M` (CR shown by `cat -v`);
  * kubelet CRI / `kubectl logs --timestamps` / docker timestamps, `2025-05-30 18:28:27.890 | ` (log
    viewers), docker-compose `svc  | `, `  | ` and `│ ... │` frames (k9s, `kubectl describe`, tables);
  * vLLM process prefixes, repeated: `(Worker pid=357) (Worker_TP0 pid=357) `, `(VllmWorker rank=0 pid=1)`,
    `[1/8,TP1][pid=5510] `, and a vLLM process name without its pid (`(Worker_TP1) ERROR [...]`, `(EngineCore_DP0)`),
    which may be followed by a bare level (`(Worker_TP1) ERROR RuntimeError: ...`);
  * a leading backtick (and its closing one) left by text pasted through Markdown;
  * logger headers: vLLM `ERROR 11-12 10:00:01 [core.py:1100] `, the older `ERROR 11-18 18:07:28
    engine.py:366] ` (no bracket), `ERROR [multiproc_executor.py:949] ` (no timestamp), custom
    `2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] `, glog / c10 `[rank0]:[E1122 13:17:04.1
    ProcessGroupNCCL.cpp:632] ` and `[E ProcessGroupNCCL.cpp:563] `, Ray C++ `[2025-04-15 00:31:11,815 E
    808 17795] `, uvicorn `ERROR:    `.
"""

from __future__ import annotations

import re
from typing import NamedTuple

NOISE_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
#: ANSI colour whose ESC byte was lost or rendered as text (`^[[1;36m`, `ESC[0;0m`, ` [36m`)
_TEXT_ANSI = re.compile(r"(?:\^\[|ESC)\[[0-9;]*m|(?:(?<=\s)|^)\[[0-9;]{1,8}m")
_CRI = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s(?:(?:stdout|stderr)\s[FP]\s)?")
#: `2025-05-30 18:28:27.890 | ` (log viewers) or a custom `2024-12-19 21:40:35 ERROR 56542 [file.py:64] ` header
_DATED = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? (?:\| ?|(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d+ )?"
    r"\[(?P<src>[^\]]{1,120})\] ?)"
)
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]{0,62}\s+\|\s")
_FRAME = re.compile(r"^\s{0,8}[│|]\s?")
_FRAME_END = re.compile(r"\s*│$")
_PROC = re.compile(
    r"^\((?P<p>[^()\s]{1,80}(?: [^()]{0,80}?)? ?pid=\d+[^()]{0,80})\)\s?|^\[\d+/\d+,(?P<r>[^\]]{1,20})\]\[pid=\d+\]\s?"
)
#: a vLLM process name without `pid=` (hand-trimmed or re-logged lines)
_PROC_NAME = re.compile(r"^\((?P<n>(?:Worker|VllmWorker|EngineCore|APIServer|ApiServer)[\w-]{0,40})\)\s?")
#: a bare level right after a process prefix (no timestamp, no logger source)
_BARE_LEVEL = re.compile(r"^(?P<v>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?=\S)")
_RAY = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<g>[DIWEF]) \d+ \d+\] ")
_HDR = re.compile(
    r"^(?:(?P<v>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d\d-\d\d [\d:.]+ )?"
    r"(?:\[(?P<src>[^\]]{0,120})\]|(?P<src2>[\w./-]{1,120}\.py:\d+)\]) ?"
    r"|(?:\[rank\d+\]:)?\[(?P<g>[DIWEF])(?:\d{3,4} [\d:.]+)? (?P<gsrc>[^\]\s]{1,120}:\d+)\] ?"
    r"|(?P<u>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+)"
)
_GLOG_LEVELS = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}

_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Fault)\b(?::\s|:?$)")
#: a process prefix that names an engine or worker process
_ENGINE_PROC = re.compile(r"EngineCore|Worker|TP\d")
#: logger source files of the engine / worker side (the API server's request handlers are not)
_ENGINE_SRC = re.compile(
    r"(?:^|/)(?:core|multiproc_executor|engine|worker_base|multiproc_worker_utils|async_llm_engine|llm_engine"
    r"|gpu_worker|worker|\w*model_runner\w*|forward_context)\.py:"
)
_REQUEST_SRC = re.compile(r"(?:^|/)(?:serving\w*|api_server|launcher|protocol|chat_utils|logger)\.py:")


class Line(NamedTuple):
    level: str | None
    payload: str
    proc: str | None  # the process prefix, e.g. "Worker_TP0 pid=357"
    src: str | None  # the logger's source, e.g. "core.py:1100"


def parse_line(line: str) -> Line:
    """Split one raw log line into level, payload, process prefix and logger source."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "m" in line and ("[" in line) and ("^[[" in line or "ESC[" in line or "[0m" in line or "[0;0m" in line):
        line = _TEXT_ANSI.sub("", line)
        if line[:1] == " " and line.lstrip()[:1] in ("(", "["):
            line = line.lstrip()
    line = line.rstrip()
    if line.endswith("^M"):
        line = line[:-2].rstrip()
    if line[:1] == "`":
        line = line.lstrip("`")
        if line.endswith("`"):
            line = line.rstrip("`").rstrip()
    if not line:
        return Line(None, line, None, None)
    level = src = proc = None
    c = line[0]
    if c.isdigit():
        m = _CRI.match(line)
        if m:
            line = line[m.end() :]
        else:
            m = _DATED.match(line)
            if m:
                line = line[m.end() :]
                if m.group("lvl"):
                    level, src = m.group("lvl"), m.group("src")
    c = line[:1]
    if c in (" ", "│", "|"):
        m = _FRAME.match(line)
        if m:
            line = line[m.end() :]
            if line.endswith("│"):
                line = _FRAME_END.sub("", line)
    elif c.isalnum() and "|" in line[:80]:
        m = _COMPOSE.match(line)
        if m:
            line = line[m.end() :]
    for _ in range(3):
        if line[:1] not in ("(", "["):
            break
        m = _PROC.match(line) or _PROC_NAME.match(line)
        if not m:
            break
        proc = m.group("n") if "n" in m.re.groupindex else m.group("p") or m.group("r")
        line = line[m.end() :]
        if line[:2] in (" [", " ("):
            line = line[1:]
    if level is None:
        c = line[:1]
        if c in "DIWEC[":
            m = _HDR.match(line)
            if m:
                if m.group("v"):
                    level, src = m.group("v"), m.group("src") or m.group("src2")
                elif m.group("g"):
                    level, src = _GLOG_LEVELS[m.group("g")], m.group("gsrc")
                else:
                    level = m.group("u")
                line = line[m.end() :]
            elif c == "[":
                m = _RAY.match(line)
                if m:
                    level = _GLOG_LEVELS[m.group("g")]
                    line = line[m.end() :]
            elif proc is not None:
                m = _BARE_LEVEL.match(line)
                if m:
                    level = m.group("v")
                    line = line[m.end() :]
    return Line(level, line, proc, src)


def strip_prefixes(line: str) -> tuple[str | None, str]:
    """Return (level or None, payload) of one raw log line (see the module docstring for the forms)."""
    p = parse_line(line)
    return p.level, p.payload


def is_exception_line(payload: str) -> bool:
    """True for a Python exception line such as `ValueError: msg` or a bare `AssertionError`."""
    return _EXC_LINE.match(payload) is not None


def context_of(line: Line) -> str:
    """'engine' (an engine / worker process logged it), 'request' (the API server's request handling) or
    'plain' (cannot tell: an interpreter-printed line without prefixes)."""
    if line.src and _REQUEST_SRC.search(line.src):
        return "request"
    if line.proc and _ENGINE_PROC.search(line.proc):
        return "engine"
    if line.src and _ENGINE_SRC.search(line.src):
        return "engine"
    return "plain"
