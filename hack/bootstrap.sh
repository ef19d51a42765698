#!/usr/bin/env bash
# Create/refresh the project's Python environment (.venv) with the operator and its test deps.
# Idempotent: re-installs only when pyproject.toml changed. Sourced by hack/test.sh and hack/dev.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.gdn-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing gdn-operator[test] into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  echo "$want" > "$stamp"
fi
