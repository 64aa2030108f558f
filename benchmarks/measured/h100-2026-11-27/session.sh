#!/usr/bin/env bash
# GPU session driver (2026-11-27), run from the repository root on the lent machine, in two calls:
#   bash benchmarks/measured/h100-2026-11-27/session.sh COMMIT default   # install, env, kernel profile, default tests
#   bash benchmarks/measured/h100-2026-11-27/session.sh COMMIT slow      # every slow test (same install)
# Install: wheels carried in .whl (dp-accounting, diffprivlib, scikit-learn 1.7, typer 0.28); the image
# has JAX with CUDA. The timed profile runs alone on the machine, before the tests.
# Everything lands in $OUT (default /tmp/res); logs and traces in $OUT/rest.tgz.
set -u
R=${OUT:-/tmp/res}; mkdir -p "$R/r"
PHASE=${2:-default}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg CBDP_COMMIT="${1:-unknown}"
log() { echo "[$(date +%T)] $*" >> "$R/progress.txt"; }
log "start $PHASE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$R/r/install.log" 2>&1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/r/install.log" 2>&1
echo "install rc $?" >> "$R/r/install.log"
log installed
if [ "$PHASE" = default ]; then
  { nvidia-smi; nproc; python3 -c "import jax, flax, optax, sklearn, dp_accounting, cbdp_jax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'sklearn', sklearn.__version__, jax.devices(), jax.default_backend())"; } > "$R/env.txt" 2>&1
  timeout 130 python3 benchmarks/gpu_profile.py --device gpu --out "$R/gpu_profile.json" --trace-dir "$R/r" > "$R/r/gpu_profile.log" 2>&1
  log "gpu_profile rc $?"
  # The README's command with -n 14 workers sharing the GPU; -v so a timeout still says what passed
  timeout 320 python3 -m pytest -q -v -n 14 -p no:cacheprovider --timeout 240 --durations=10 > "$R/tests_default.log" 2>&1
  log "tests rc $?"
  tail -15 "$R/tests_default.log" >> "$R/progress.txt"
else
  timeout 520 python3 -m pytest -q -v -m slow -n 15 -p no:cacheprovider --timeout 480 --durations=15 > "$R/tests_slow.log" 2>&1
  log "slow tests rc $?"
  tail -25 "$R/tests_slow.log" >> "$R/progress.txt"
fi
tar czf "$R/rest_$PHASE.tgz" -C "$R" r && rm -rf "$R/r"
log done
