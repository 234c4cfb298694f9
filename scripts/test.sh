#!/usr/bin/env bash
# The test command: sets everything up itself, then lint + the whole suite (slow end-to-end
# tests included). Extra arguments go to pytest (e.g. -m "not slow", -k packaging).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check notebook_elastic tests benchmarks scripts
.venv/bin/ruff format --check notebook_elastic tests benchmarks scripts
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
