#!/usr/bin/env bash
# GPU session driver (2026-11-26), run from the repository root on the lent machine:
#   bash benchmarks/measured/h100-2026-11-26/session.sh COMMIT
# Install (wheels carried in .whl: dp-accounting, diffprivlib, scikit-learn 1.7, typer 0.28; the image
# has JAX 0.11.2 with CUDA 13), then the timed benchmarks alone on the machine (the kernel profile of
# MLP training; training runs per second), then the default test suite on the GPU backend.
# Everything lands in $OUT (default /tmp/res); logs and traces in $OUT/rest.tgz.
set -u
R=${OUT:-/tmp/res}; mkdir -p "$R/r"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg CBDP_COMMIT="${1:-unknown}"
log() { echo "[$(date +%T)] $*" >> "$R/progress.txt"; }
log start
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$R/r/install.log" 2>&1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/r/install.log" 2>&1
echo "install rc $?" >> "$R/r/install.log"
{ nvidia-smi; nproc; python3 -c "import jax, flax, optax, sklearn, dp_accounting, cbdp_jax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'sklearn', sklearn.__version__, jax.devices(), jax.default_backend())"; } > "$R/env.txt" 2>&1
log installed
# Timed, alone
timeout 130 python3 benchmarks/gpu_profile.py --device gpu --out "$R/gpu_profile.json" --trace-dir "$R/r" > "$R/r/gpu_profile.log" 2>&1
log "gpu_profile rc $?"
timeout 140 python3 benchmarks/training_throughput.py --device gpu --steps 20 --runs 8192 --loop-runs 16 --cli-runs 100000 --cli-steps 20 --out "$R/training_throughput.json" > "$R/r/training_throughput.log" 2>&1
log "training_throughput rc $?"
# The default test suite (README's command, -n 12 workers sharing the GPU); -v so a timeout still says
# which tests passed and failed
timeout 300 python3 -m pytest -q -v -n 12 -p no:cacheprovider --timeout 240 --junitxml="$R/r/junit.xml" > "$R/tests.log" 2>&1
log "tests rc $?"
tail -5 "$R/tests.log" >> "$R/progress.txt"
tar czf "$R/rest.tgz" -C "$R" r && rm -rf "$R/r"
log done
