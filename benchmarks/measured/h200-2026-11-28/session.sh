#!/usr/bin/env bash
# GPU session driver (2026-11-28, one H200, a 15-minute lease), run from the repository root on the lent
# machine in two calls:
#   bash benchmarks/measured/h200-2026-11-28/session.sh COMMIT bench   # install, env, black-box table,
#                                                                      # kernel profile, defaults 100k
#   bash benchmarks/measured/h200-2026-11-28/session.sh COMMIT tests   # the default test suite (-n 14)
# Install: wheels carried in .whl (dp-accounting, diffprivlib, scikit-learn, typer); the image has JAX
# with CUDA. Each step has its own timeout; a step cut short does not stop the next. Results in $OUT.
set -u
R=${OUT:-/tmp/res}; mkdir -p "$R/logs"
PHASE=${2:-bench}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg CBDP_COMMIT="${1:-unknown}"
log() { echo "[$(date +%T)] $*" >> "$R/progress.txt"; }
log "start $PHASE $CBDP_COMMIT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$R/logs/install_$PHASE.log" 2>&1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/logs/install_$PHASE.log" 2>&1
log "installed rc $?"
if [ "$PHASE" = bench ]; then
  { nvidia-smi; nproc; python3 -c "import jax, flax, optax, dp_accounting, cbdp_jax; print('jax', \
jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices(), jax.default_backend())"; } \
    > "$R/env.txt" 2>&1
  # 1. The black-box table (issue 43): full digits, 10^5 trainings per side, row groups by priority.
  OUT="$R/bb" BB_BUDGET=250 bash benchmarks/gpu_black_box.sh "$CBDP_COMMIT"
  log "black-box done: $(tr '\n' ' ' < "$R/bb/progress.txt")"
  # 2. The MLP kernel profile at the library's batch (issue 41): XLA's default GEMMs, then Triton, cuBLASLt.
  for v in default triton cublaslt; do
    case $v in default) f="";; triton) f="--xla_gpu_triton_gemm_any=true";; cublaslt) f="--xla_gpu_enable_cublaslt=true";; esac
    XLA_FLAGS="$f" timeout 60 python3 benchmarks/gpu_profile.py --device gpu --settings wide-library-batch \
      --variant "$v" --out "$R/gpu_profile_$v.json" > "$R/logs/gpu_profile_$v.log" 2>&1
    log "gpu_profile $v rc $? $(grep -h 'TFLOP/s' "$R/logs/gpu_profile_$v.log" | tail -2 | tr '\n' ' ')"
  done
  # 3. Ours at the defaults (EstimatorConfig(), default class), Laplace eps 1 and Gaussian sigma 1,
  #    alpha 2, 100k per side, seed 0: a fresh process with an empty program store and JAX cache.
  mkdir -p "$R/samples"
  python3 - "$R/samples" <<'PY' > "$R/logs/draw.log" 2>&1
import sys, numpy as np
n = 100_000
rng = np.random.default_rng(0)
np.savez(f"{sys.argv[1]}/laplace.npz", p=rng.laplace(0, 1, (n, 1)), q=rng.laplace(1, 1, (n, 1)))
rng = np.random.default_rng(0)
np.savez(f"{sys.argv[1]}/gaussian.npz", p=rng.normal(0, 1, (n, 1)), q=rng.normal(1, 1, (n, 1)))
PY
  for c in laplace gaussian; do
    CBDP_JAX_CACHE_DIR="$R/cache_$c" timeout 55 python3 benchmarks/vs_dp_auditorium.py --worker-ours \
      --ours-settings default --samples "$R/samples/$c.npz" --alpha 2 --seed 0 --repeats 2 \
      --result "$R/ours_${c}_100000.json" > "$R/logs/ours_$c.log" 2>&1
    log "ours $c 100k rc $?"
    rm -rf "$R/cache_$c"
  done
  rm -rf "$R/samples"
else
  timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -v -n 14 -p no:cacheprovider --durations=10 \
    > "$R/tests_default.log" 2>&1
  log "tests rc $?"
  tail -15 "$R/tests_default.log" >> "$R/progress.txt"
  gzip -f "$R/tests_default.log"
fi
log done
