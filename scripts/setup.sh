#!/usr/bin/env bash
# Creates .venv (once) and installs everything the project needs into it. Idempotent and quick
# when nothing changed. torch is pinned to the CPU build 2.13.0 when absent: an open range would
# pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (CPU build)"
  "$VPY" -m pip install --quiet "torch==2.13.0"
fi
stamp=.venv/.notebook-elastic-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing notebook-elastic and its test dependencies"
  "$VPY" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
fi
