#!/usr/bin/env bash
# One GPU session (about 6 minutes on one H200), run from the repository root on the lent machine:
#
#   bash benchmarks/gpu_session.sh
#
# 1. install (wheels carried in .whl/ if any, then this tree without dependencies: the image has JAX
#    with CUDA), env.txt;
# 2. the MLP kernel profile at the library's batch (width 512, 256 members, 4096 per side) under XLA's
#    default GEMM path, then each compiler variant in a fresh process (cuBLASLt epilogue fusion, Triton
#    GEMM fusion, both), and the default width (64) once: gpu_profile_<variant>.json;
# 3. ours alone at the defaults (benchmarks/vs_dp_auditorium.py's worker, --ours-settings default:
#    EstimatorConfig() and the default class) on Laplace eps 1 and Gaussian sigma 1, alpha 2, at 10k,
#    100k and 1M per side, seed 0: a fresh process per size with an empty program store and JAX
#    cache (first call, then 2 warm calls): ours_<case>_<n>.json.
#
# Everything lands in $OUT (default /tmp/gpu-out): progress.txt says what finished and when, each step
# has its own log and its own timeout, and a step that fails or times out does not stop the next one.
set -u
R=${OUT:-/tmp/gpu-out}
mkdir -p "$R/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
log() { echo "[$(date +%T)] $*" | tee -a "$R/progress.txt"; }
log "start $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# 1. Install and environment.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$R/logs/install.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/logs/install.log" 2>&1
log "install rc $?"
{ nvidia-smi; nproc; python3 -c "import jax, flax, optax, cbdp_jax; print('jax', jax.__version__, \
'flax', flax.__version__, 'optax', optax.__version__, jax.devices(), jax.default_backend())"; } \
  > "$R/env.txt" 2>&1
log "env rc $?"

# 2. The kernel profile: the library's batch under each compiler variant, each in its own process.
profile() {  # profile VARIANT FLAGS SETTINGS...
  local variant=$1 flags=$2; shift 2
  XLA_FLAGS="$flags" timeout 75 python3 benchmarks/gpu_profile.py --device gpu --settings "$@" \
    --variant "$variant" --out "$R/gpu_profile_$variant.json" > "$R/logs/gpu_profile_$variant.log" 2>&1
  log "gpu_profile $variant rc $? $(grep -h 'TFLOP/s =' "$R/logs/gpu_profile_$variant.log" | head -2 | tr '\n' ' ')"
}
profile default "" wide-library-batch default-width
profile cublaslt "--xla_gpu_enable_cublaslt=true" wide-library-batch
profile triton "--xla_gpu_triton_gemm_any=true" wide-library-batch

# 3. Ours alone at the defaults, fresh process per case and size, empty program store and JAX cache.
DATA="$R/samples"
mkdir -p "$DATA"
python3 - "$DATA" <<'PY' > "$R/logs/draw.log" 2>&1
import sys, numpy as np
out = sys.argv[1]
for n in (10_000, 100_000, 1_000_000):
    rng = np.random.default_rng(0)
    np.savez(f"{out}/laplace_{n}.npz", p=rng.laplace(0, 1, (n, 1)), q=rng.laplace(1, 1, (n, 1)))
    rng = np.random.default_rng(0)
    np.savez(f"{out}/gaussian_{n}.npz", p=rng.normal(0, 1, (n, 1)), q=rng.normal(1, 1, (n, 1)))
PY
log "draw rc $?"
for n in 10000 100000 1000000; do
  for case in laplace gaussian; do
    cache="$R/cache_${case}_$n"
    rm -rf "$cache"
    CBDP_JAX_CACHE_DIR="$cache" timeout 90 python3 benchmarks/vs_dp_auditorium.py --worker-ours \
      --ours-settings default --samples "$DATA/${case}_$n.npz" --alpha 2 --seed 0 --repeats 2 \
      --result "$R/ours_${case}_$n.json" > "$R/logs/ours_${case}_$n.log" 2>&1
    log "ours $case $n rc $? $(python3 -c "import json,sys; r=json.load(open('$R/ours_${case}_$n.json')); \
print('import %.2f s, first %.2f s, warm %s s, bound %.4f' % (r['import_s'], r['cold']['wall_s'], \
[round(w['wall_s'], 3) for w in r['warm']], r['cold']['bound']))" 2>/dev/null)"
    rm -rf "$cache"
  done
done

profile both "--xla_gpu_enable_cublaslt=true --xla_gpu_triton_gemm_any=true" wide-library-batch
rm -rf "$DATA"
log done
