#!/usr/bin/env bash
# The GPU check of issue #20, in one call on a lent GPU machine (one H200, 16 cores, no
# network): the GPU tests (tests/gpu, marker gpu) and the GPU benchmark (bench/gpu_bench.py),
# then one summary. Budget: under 8 minutes (tests 4 min at most, benchmark 3 min at most).
#
# Prepare here (once): bash scripts/gpu_wheelhouse.sh   # fills .whl with what the machine lacks
# Then, with the device tool:  run(command="bash scripts/gpu_check.sh", carry=[".whl"],
#                                  timeout_s=540)
# The summary is the last lines of the output and $OUT/gpu_check.txt (with the full log).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
{
  echo "== device"; nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee "$LOG"
echo "== tests/gpu" | tee -a "$LOG"
timeout 240 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gpu -o addopts="" \
  -rA 2>&1 | tee -a "$LOG"
TESTS_RC=${PIPESTATUS[0]}
echo "== bench/gpu_bench.py" | tee -a "$LOG"
timeout 180 python3 bench/gpu_bench.py --seconds 8 2>&1 | tee -a "$LOG" | tail -n 1 > "$OUTDIR/bench.json"
BENCH_RC=${PIPESTATUS[0]}
{
  echo "== summary"
  echo "tests rc=$TESTS_RC: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$LOG" | tail -n 1)"
  echo "bench rc=$BENCH_RC: $(cat "$OUTDIR/bench.json")"
} | tee "$OUTDIR/gpu_check.txt"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
