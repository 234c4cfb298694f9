#!/usr/bin/env bash
# Git's clean filter for the shipped notebooks (.gitattributes: notebooks/*.ipynb): a notebook a
# person ran in JupyterLab keeps its outputs on disk, and git sees it as committed, stripped by
# scripts/strip_notebook.py (#39 item 11: autosave dirtied a fresh clone). scripts/setup.sh runs
# this, so both README commands install it; it writes this clone's .git/config only. Outside a
# git work tree (an unpacked sdist) it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git config filter.notebook-outputs.clean ".venv/bin/python scripts/strip_notebook.py"
fi
