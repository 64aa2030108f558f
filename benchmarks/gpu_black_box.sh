#!/usr/bin/env bash
# The black-box table on a GPU: the full digits (1,797 examples), 10^5 trainings per side, about five
# minutes on one H200. Run from the repository root on the lent machine:
#   bash benchmarks/gpu_black_box.sh [COMMIT]
# Installs the carried wheels if cbdp_jax does not import (as benchmarks/measured/h100-2026-11-26/
# session.sh did), then runs benchmarks/black_box.py row group by row group, most important first,
# each under its own timeout, every finished row merged into $OUT/black-box-gpu.json at once (a group
# cut short keeps the rows it finished). Logs in $OUT/logs/, progress in $OUT/progress.txt.
# A dry run on a CPU: DEVICE=cpu EXAMPLES=300 RUNS=500 OUT=/tmp/dry bash benchmarks/gpu_black_box.sh
set -u
R=${OUT:-/tmp/res}; mkdir -p "$R/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg CBDP_COMMIT="${1:-unknown}"
log() { echo "[$(date +%T)] $*" >> "$R/progress.txt"; }
log start
if ! python3 -c "import cbdp_jax, dp_accounting, sklearn" 2> /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$R/logs/install.log" 2>&1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/logs/install.log" 2>&1
  log "installed (rc $?)"
fi
{ nvidia-smi; nproc; python3 -c "import jax, flax, optax, sklearn, dp_accounting, cbdp_jax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices(), jax.default_backend())"; } > "$R/env.txt" 2>&1
T0=$(date +%s)
left() { echo $(( ${BB_BUDGET:-290} - ($(date +%s) - T0) )); }
group() {  # group NAME TIMEOUT ARGS...: one invocation, skipped when too little time is left
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 80 ]; then log "$name skipped ($budget s left)"; return; fi
  [ "$limit" -gt "$budget" ] && limit=$budget
  timeout "$limit" python3 benchmarks/black_box.py --device "${DEVICE:-gpu}" --examples "${EXAMPLES:-1797}" \
    --runs "${RUNS:-100000}" --chunk 16384 --budget $(( limit - 70 )) --out "$R/black-box-gpu.json" "$@" \
    > "$R/logs/$name.log" 2>&1
  log "$name rc $? ($(left) s left)"
}
# 1. the target: eps 10, full batch, T = 100, worst-case against today's default (average case)
group full-10 170 --epsilons 10 --samplings full --cases worst-case:crafted,average-case:default
# 2. the Poisson-sampled setting at eps 10
group poisson-10 110 --epsilons 10 --samplings poisson:0.1 --cases worst-case:crafted,average-case:default
# 3. the other theoretical eps, worst case first
group full-rest 120 --epsilons 4,2,1 --samplings full --cases worst-case:crafted,average-case:default
log done
