"""Redact credential-looking text before it leaves the operator (status, Events, admission messages, logs).

Engine crash output can print tokens (a failing download prints the Authorization header, a traceback
prints the environment), and user input quoted back in messages can hold one. Everything the operator
copies from such sources goes through `redact`, which replaces:

* Hugging Face tokens (`hf_…`), OpenAI/Anthropic-style keys (`sk-…`), GitHub tokens (`ghp_…`, `github_pat_…`),
  AWS access key ids (`AKIA…`), Slack tokens (`xox?-…`), JWTs (`eyJ….….…`);
* `Authorization: Bearer …` / `Basic …` values;
* the value of `KEY=value`, `key: value` and `"key": "value"` pairs whose key looks secret (token,
  secret, password, passwd, api_key, apikey, access_key, private_key, credential, auth).
"""

from __future__ import annotations

import re

MASK = "<redacted>"

_TOKENS = re.compile(
    r"""
    \bhf_[A-Za-z0-9]{8,}
    | \bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}
    | \bgh[pousr]_[A-Za-z0-9]{20,}
    | \bgithub_pat_[A-Za-z0-9_]{20,}
    | \bAKIA[0-9A-Z]{16}\b
    | \bxox[abprs]-[A-Za-z0-9\-]{10,}
    | \beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}
    """,
    re.VERBOSE,
)
_AUTH = re.compile(r"(?i)\b(authorization\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)[^\s\"',;]+")
_SECRET_KEY = r"[A-Za-z0-9_.\-]*(?:token|secret|passw(?:or)?d|api[_\-]?key|access[_\-]?key|private[_\-]?key|credential|auth)[A-Za-z0-9_.\-]*"
_PAIR = re.compile(r"(?i)(?P<key>[\"']?" + _SECRET_KEY + r"[\"']?\s*(?:=|:)\s*)(?P<q>[\"']?)(?P<val>[^\s\"',;}]+)")


def redact(text: str) -> str:
    """`text` with anything that looks like a credential replaced by <redacted>."""
    if not text:
        return text
    out = _AUTH.sub(lambda m: m.group(1) + MASK, text)
    out = _PAIR.sub(lambda m: m.group("key") + m.group("q") + (m.group("val") if m.group("val") == MASK else MASK), out)
    return _TOKENS.sub(MASK, out)
