#!/usr/bin/env bash
# The main job: runs notebooks/quickstart.ipynb headless on a real kernel, on the local backend
# (elastic torchrun on this machine: scale 1 -> 2 nodes at epoch 35, preempt one at epoch 70),
# and prints each cell's output and the outcome. Sets everything up itself on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NOTEBOOK_ELASTIC_HOME="${NOTEBOOK_ELASTIC_HOME:-$PWD/.quickstart-home}"
mkdir -p build
exec .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb --save build/quickstart.executed.ipynb
