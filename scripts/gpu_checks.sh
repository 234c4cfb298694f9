#!/usr/bin/env bash
# The GPU checks, in one run on a machine with CUDA (the project's lent H100/H200 box, or yours):
#   1. tests/test_gpu.py           nccl, one rank per GPU, a killed worker, a refused range;
#   2. benchmarks/gpu.py           first step on GPU vs CPU, GPU figures, joiner eviction;
#   3. benchmarks/local_backend.py first step and resume figures on this machine's cores (CPU ranks);
#   4. benchmarks/scale_costs.py   the 8x2 shape of issue 16 item 5 (CPU ranks);
#   5. pytest -m torch_contract    the torch contract on this machine's (CUDA) torch;
#   6. benchmarks/nccl_in_place.py what in place needs of NCCL, on one GPU (#41 item 4);
#   7. benchmarks/in_place.py      in place against restart on this machine's cores (CPU ranks).
# Each step has its own time limit and writes its log (and its results JSON) to $OUT (default
# build/gpu-checks) as it ends, so a run cut short still returns what it finished.
# Dependencies: the machine's torch; the rest of ours (ipython, ipywidgets, jupyter_server,
# nbformat, and what they need) from wheels in .whl/ when that folder is there (a machine
# with no registry), else from what is installed.
# usage: bash scripts/gpu_checks.sh [STEP...]   (steps: tests bench local scale contract nccl inplace;
#        default: nccl tests bench local scale contract)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-checks}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ne-site .whl/*.whl || exit 1
  export PYTHONPATH="$PWD:/tmp/ne-site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 NOTEBOOK_ELASTIC_HOME=${NOTEBOOK_ELASTIC_HOME:-$(mktemp -d /tmp/ne-gpu-home.XXXX)}
steps=${*:-nccl tests bench local scale contract}
{
  date -u
  nvidia-smi -L || true
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count())'
  nproc
} 2>&1 | tee "$OUT/machine.txt"

step() {  # step NAME LIMIT_S COMMAND...: run it with a limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n 25 "$OUT/$name.log"
}

for s in $steps; do
  case $s in
    tests) step test_gpu 240 "$PY" -m pytest -p no:cacheprovider -v -rs tests/test_gpu.py ;;
    bench)
      step bench_gpu 200 "$PY" benchmarks/gpu.py
      cp benchmarks/results/gpu.json "$OUT/gpu.json" 2>/dev/null ;;
    local)
      CUDA_VISIBLE_DEVICES= step bench_local 200 "$PY" benchmarks/local_backend.py --quick
      cp benchmarks/results/local_backend.json "$OUT/local_backend.json" 2>/dev/null ;;
    scale)
      CUDA_VISIBLE_DEVICES= step bench_scale 150 "$PY" benchmarks/scale_costs.py --quick --shapes 1x1,4x2,8x2 \
        --machine "$(nproc)-core GPU machine, CPU ranks"
      cp benchmarks/results/scale_costs.json "$OUT/scale_costs.json" 2>/dev/null ;;
    contract)
      CUDA_VISIBLE_DEVICES= step contract 200 "$PY" -m pytest -p no:cacheprovider -q -rs -m torch_contract -n 8 tests ;;
    nccl)
      step nccl_in_place 130 "$PY" benchmarks/nccl_in_place.py
      cp benchmarks/results/nccl_in_place.json "$OUT/nccl_in_place.json" 2>/dev/null ;;
    inplace)
      CUDA_VISIBLE_DEVICES= step bench_in_place 110 "$PY" benchmarks/in_place.py --quick
      cp benchmarks/results/in_place.json "$OUT/in_place.json" 2>/dev/null ;;
    *) echo "unknown step $s (tests bench local scale contract nccl inplace)"; exit 2 ;;
  esac
done
