#!/usr/bin/env bash
# Refreshes the README's and the documentation's pictures (docs/images/) from the browser test
# that takes them: Run All on the shipped quickstart in JupyterLab (Chromium), the dashboard once
# the job grew to 2 nodes, and the jobs panel beside it. Check the new pictures in with the change
# that altered the look.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "pictures: running the browser test that takes them (about a minute)"
.venv/bin/python -m pytest -p no:cacheprovider -q -n 0 \
  "tests/test_browser.py::test_run_all_on_the_shipped_quickstart_keeps_the_dashboard_live_and_steerable"
mkdir -p docs/images
cp test-artifacts/readme-dashboard.png docs/images/dashboard.png
cp test-artifacts/readme-panel.png docs/images/panel.png
echo "pictures: docs/images/dashboard.png and docs/images/panel.png refreshed"
