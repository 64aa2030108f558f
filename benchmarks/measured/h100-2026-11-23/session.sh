#!/usr/bin/env bash
# GPU session driver: install, tests (phase A, with the untimed accuracy and coverage studies beside them),
# then the timed benchmarks alone (phase B). Writes everything under /tmp/res.
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R
rm -rf /tmp/proj; cp -r "$1" /tmp/proj; cd /tmp/proj
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CBDP_COMMIT="$2" MPLBACKEND=Agg
log() { echo "[$(date +%T)] $*" >> $R/progress.txt; }
log start
{ nvidia-smi; which python3; python3 -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|jax-cuda|flax|optax|numpy|scipy|chex|hypothesis|pytest|dp)"; } > $R/env.txt 2>&1
python3 -m pip install -q --no-index --no-deps .whl/*.whl >> $R/install.log 2>&1
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> $R/install.log 2>&1; echo "install rc $?" >> $R/install.log
python3 -c "import jax, flax, optax, cbdp_jax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices(), jax.default_backend())" >> $R/env.txt 2>&1
log installed
# Phase A
( timeout 900 python3 -m pytest -q -n 6 -p no:cacheprovider --timeout 600 --junitxml=$R/junit.xml > $R/tests.log 2>&1; echo $? > $R/tests.rc; log tests done ) &
( timeout 600 python3 benchmarks/accuracy.py --device gpu --out $R/accuracy.json > $R/accuracy.log 2>&1; echo $? > $R/accuracy.rc; log accuracy done
  timeout 400 python3 -c "from cbdp_jax.experiments import coverage; import json; s = coverage.run('$R/coverage'); print(s)" > $R/coverage.log 2>&1; echo $? > $R/coverage.rc; log coverage done ) &
wait
log phaseA done
# Phase B (timed, alone)
for b in scaling time_to_target throughput memory; do
  timeout 480 python3 benchmarks/$b.py --device gpu --out $R/$b.json > $R/$b.log 2>&1; echo $? > $R/$b.rc; log $b done
done
timeout 300 python3 benchmarks/auditorium_case.py --out $R > $R/auditorium.log 2>&1; echo $? > $R/auditorium.rc; log auditorium done
log all done
