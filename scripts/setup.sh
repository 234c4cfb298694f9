#!/usr/bin/env bash
# Creates .venv (once) and installs everything the project needs into it. Idempotent and quick
# when nothing changed. torch is pinned to the CPU build 2.13.0 when absent: an open range would
# pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log=$(mktemp -t notebook-elastic-setup.XXXXXX)
trap 'rm -f "$log"' EXIT
# Progress: pip's own lines for what it fetches and installs, as they come (every stage of the
# pipe line-buffered: a plain `cut` held them back for a minute at a time), and each step's duration.
pip_install() {
  local started=$SECONDS status
  set +o pipefail
  .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 | tee "$log" \
    | { grep --line-buffered -E "^(Collecting|Downloading|Building|Installing collected|Successfully installed)" || true; } \
    | sed -u -e 's/^\(.\{150\}\).*/\1/' -e 's/^/  pip: /'
  status=${PIPESTATUS[0]}
  set -o pipefail
  if [[ $status -ne 0 ]]; then
    grep -v "is ignored: it is neither" "$log" >&2
    echo "setup: pip install $* failed" >&2
    exit 1
  fi
  echo "setup: done in $((SECONDS - started)) s"
}
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
  pip_install --upgrade pip
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (CPU build)"
  pip_install "torch==2.13.0"
fi
stamp=.venv/.notebook-elastic-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing notebook-elastic and its test dependencies"
  pip_install -e ".[test]"
  echo "$want" > "$stamp"
fi
# The package's bytecode, as a wheel's install writes it (an editable install does not): where
# PYTHONDONTWRITEBYTECODE is set (this machine, CI, many container images) every process of a job
# compiled the package from source at each start: an agent's imports 1.05 s of CPU against 0.15 s,
# a supervisor's 1.54 s against 0.16 s, a warm worker's 0.06 s against 0.01 s. compileall skips
# what is current; a file edited since is compiled in memory at import, as before.
echo "setup: the package's bytecode (python -m compileall notebook_elastic)"
"$VPY" -m compileall -q notebook_elastic
# Running the shipped notebooks never dirties the clone: git sees them without their outputs.
bash scripts/git_filters.sh
