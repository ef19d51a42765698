"""Generate docs/compatibility.md: per vLLM release x TP x CUDA-graph mode x MTP, what admission decides (safe /
mitigated, with the measured cost / refused, naming the rule) and which GPU captures back each cell.

    .venv/bin/python hack/gen_compat.py > docs/compatibility.md

The cells are judged by the operator's own evaluator (operator/gdn_operator/rules/compat.py) against
rules/data/rules.yaml; the evidence is read from the committed captures in tests/fixtures/vllm-<release>-<gpu>*/
(each engine's own start-up line). tests/rules/test_compat.py fails when the committed file differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gdn_operator.rules import load_rules
from gdn_operator.rules.compat import matrix, scan_captures
from gdn_operator.rules.compatdoc import render

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ruleset = load_rules()
    captures = scan_captures(ROOT)
    sys.stdout.write(render(ruleset, matrix(ruleset, captures), captures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
