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
# The strict type checker over the package ([tool.mypy] in pyproject.toml): 0 errors. It takes one
# core for a minute or two on a fresh clone, so it runs beside the labextension's checks, the docs
# and the quick tier; its verdict is read before the rest starts (and fails the command).
echo "types: mypy --strict over notebook_elastic/ (its verdict before the rest of the tests)"
mypy_log=$(mktemp -t notebook-elastic-mypy.XXXXXX)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy=$!
trap '[[ -n $mypy ]] && kill "$mypy" 2>/dev/null; rm -f "$mypy_log"' EXIT
types() {
  local rc=0
  wait "$mypy" || rc=$?
  mypy=""
  sed 's/^/types: /' "$mypy_log"
  [[ $rc -eq 0 ]] || { echo "types: mypy failed (exit $rc)" >&2; exit 1; }
}
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
# Three test workers (pytest-xdist): most of an end-to-end test's time is spent waiting on its
# job's processes (rendezvous, restarts, a kernel), which the other workers' tests fill. Sampled
# with the torch range and the paced lane beside them, the 2 cores were busy about half the time.
# (Three once starved agents past their rendezvous deadlines, 2026-11-25; that was before the warm
# pool forked every job's processes from one that had imported torch.)
# NOTEBOOK_ELASTIC_TEST_WORKERS=0 runs everything in one process (as does -n 0 after the command).
workers="${NOTEBOOK_ELASTIC_TEST_WORKERS:-3}"
# A test still running after a minute is named as it runs (tests/conftest.py), and the slowest
# fifteen are listed at the end.
pytest_=(.venv/bin/python -m pytest -p no:cacheprovider -n "$workers" --dist worksteal)
if [[ " $* " == *" -m "* || " $* " == *" -m="* ]]; then
  rc=0  # a tier chosen by the caller (-m quick: the quick one alone)
  "${pytest_[@]}" --durations=15 "$@" || rc=$?
  types
  exit $rc
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
types
echo "tests: the rest (-m 'not quick': real jobs, kernels, browsers, clusters)"
if [[ $workers == 0 ]]; then
  tier -m "not quick" --durations=15 "$@"
  exit 0
fi
# The paced tests (-m paced: notebooks run at a reader's pace, 30 s before each cell) are mostly
# asleep: beside the two workers they cost the cores little, where inside them they held a worker
# idle for ten minutes. They run in a lane of their own, one at a time; its lines come prefixed.
# (All three at once took 4.5 minutes where one after the other took ten, but a reader's-pace
# story then ran out of steps before its replacement pod came: fresh-clone run 10.)
# Then, when the caller picked no tests (no -k, -m or path), the lane runs the torch range's
# contract subset on its oldest and newest torch (scripts/torch_range.py, one worker), beside the
# rest as well: the test command proves the range pyproject declares. NOTEBOOK_ELASTIC_TORCH_RANGE=0
# leaves it out, =1 runs it whatever was picked.
torch_range="${NOTEBOOK_ELASTIC_TORCH_RANGE:-}"
if [[ -z $torch_range ]]; then
  torch_range=1
  value_of=""  # an option whose value comes as the next argument: that value picks nothing
  for arg in "$@"; do
    if [[ -n $value_of ]]; then
      value_of=""
      continue
    fi
    [[ $arg =~ ^(-p|-n|-o|-W|-c|-r|--dist|--basetemp|--deselect|--ignore|--maxfail|--tb|--durations|--rootdir)$ ]] && value_of=$arg && continue
    [[ $arg == -k* || $arg == -m* || $arg != -* ]] && torch_range=0
  done
fi
(
  set +e
  .venv/bin/python -m pytest -p no:cacheprovider -n 0 -m "paced and not quick" --durations=3 "$@" 2>&1 \
    | sed -u 's/^/[paced] /'
  rc=${PIPESTATUS[0]}
  [[ $rc -eq 5 ]] && rc=0
  if [[ $torch_range == 1 ]]; then
    NOTEBOOK_ELASTIC_TORCH_WORKERS=${NOTEBOOK_ELASTIC_TORCH_WORKERS:-1} .venv/bin/python scripts/torch_range.py 2>&1 \
      | sed -u 's/^/[paced] /'
    [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
  fi
  exit $rc
) &
paced=$!
rc=0
# Every test's time is kept in build/test-times.xml (JUnit XML), for whoever shortens the suite.
mkdir -p build
tier -m "not quick and not paced" --durations=15 --junitxml=build/test-times.xml "$@" || rc=$?
paced_rc=0
wait "$paced" || paced_rc=$?
[[ $paced_rc -ne 0 ]] && echo "tests: the paced lane failed (exit $paced_rc; its lines above start with [paced])" >&2
[[ $rc -ne 0 ]] && exit $rc
exit $paced_rc
