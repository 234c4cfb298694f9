#!/usr/bin/env bash
# The test command: sets everything up itself, then lint + the whole suite (slow end-to-end
# tests included). Extra arguments go to pytest (e.g. -m "not slow", -k packaging).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser tests drive Debian's Chromium (Playwright's own browser download fails here).
if [[ ! -x /usr/bin/chromium ]] && command -v apt-get >/dev/null; then
  echo "setup: installing Debian chromium for the browser tests"
  sudo_=""; [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo_="sudo"
  if ! { $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq chromium chromium-driver; } >/tmp/notebook-elastic-apt.log 2>&1; then
    echo "setup: could not install chromium (see /tmp/notebook-elastic-apt.log); browser tests will say so" >&2
  fi
fi
# The Kubernetes tests drive the real kubectl as a second client of the API-server fixture
# (tests/test_kubernetes_kubectl.py; skipped with a reason without it).
if ! command -v kubectl >/dev/null && command -v apt-get >/dev/null; then
  echo "setup: installing Debian kubectl for the Kubernetes tests"
  sudo_=""; [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo_="sudo"
  if ! { $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq kubectl; } >/tmp/notebook-elastic-apt-kubectl.log 2>&1; then
    echo "setup: could not install kubectl (see /tmp/notebook-elastic-apt-kubectl.log); the kubectl tests will say so" >&2
  fi
fi
# The Slurm tests start their own munged, slurmctld and slurmd (tests/slurm_cluster.py; skipped
# with a reason without them).
if ! command -v slurmctld >/dev/null && [[ ! -x /usr/sbin/slurmctld ]] && command -v apt-get >/dev/null; then
  echo "setup: installing Debian's slurmctld, slurmd and munge for the Slurm tests"
  sudo_=""; [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo_="sudo"
  if ! { $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq slurmctld slurmd slurm-client munge; } >/tmp/notebook-elastic-apt-slurm.log 2>&1; then
    echo "setup: could not install Slurm (see /tmp/notebook-elastic-apt-slurm.log); the Slurm tests will say so" >&2
  fi
fi
.venv/bin/ruff check notebook_elastic tests benchmarks scripts docs
.venv/bin/ruff format --check notebook_elastic tests benchmarks scripts docs
# The strict type checker over the package ([tool.mypy] in pyproject.toml): 0 errors.
echo "types: mypy --strict over notebook_elastic/"
.venv/bin/mypy
# The JupyterLab extension's TypeScript: ESLint and its unit tests (vitest, in a bare DOM). Its
# node_modules come from the set-up's build of the extension (npm install, with the checked-in lock).
echo "labextension: eslint and unit tests (vitest)"
(
  cd labextension
  [[ -d node_modules/vitest && -d node_modules/eslint ]] || npm install --no-audit --no-fund --loglevel=error
  npm run --silent lint
  npm run --silent test
)
# The documentation site, warnings as errors (its reference pages are generated from the code).
echo "docs: building the site (mkdocs build --strict) into build/site"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir build/site
# Two test workers (pytest-xdist): most of an end-to-end test's time is spent waiting on its
# job's processes (rendezvous, restarts, a kernel), which the other worker's tests fill. Three
# put three multi-node jobs on 2 cores at once too often: agents starved past their rendezvous
# deadlines, and a scale-up could miss a job that ended first.
# NOTEBOOK_ELASTIC_TEST_WORKERS=0 runs everything in one process (as does -n 0 after the command).
workers="${NOTEBOOK_ELASTIC_TEST_WORKERS:-2}"
# A test still running after a minute is named as it runs (tests/conftest.py), and the slowest
# fifteen are listed at the end.
pytest_=(.venv/bin/python -m pytest -p no:cacheprovider -n "$workers" --dist worksteal)
if [[ " $* " == *" -m "* || " $* " == *" -m="* ]]; then
  exec "${pytest_[@]}" --durations=15 "$@"  # a tier chosen by the caller (-m quick: the quick one alone)
fi
# Two tiers: the quick one first (no job launched, about a minute: a broken edit shows at once),
# then the rest. pytest's 5 is "no test selected" (arguments like -k that pick only one tier).
tier() {
  local rc=0
  "${pytest_[@]}" "$@" || rc=$?
  [[ $rc -eq 5 ]] && rc=0
  return $rc
}
echo "tests: the quick tier (-m quick: no job launched)"
tier -m quick "$@"
echo "tests: the rest (-m 'not quick': real jobs, kernels, browsers, clusters)"
tier -m "not quick" --durations=15 "$@"
