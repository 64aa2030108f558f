#!/usr/bin/env bash
# The two GPU failures of session.sh, re-run on the same machine (2026-11-27):
#   bash benchmarks/measured/h100-2026-11-27/determinism.sh
# The threads test 4 times with the suite's deterministic-ops flag (tests/conftest.py) and 4 times with
# it switched off (XLA_FLAGS=--xla_gpu_deterministic_ops=false), all 8 processes at once on the one GPU;
# beside them the held-out test (4 seeds) and the same-key tests of tests/test_estimator.py.
set -u
R=${OUT:-/tmp/res}; L=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$L/install.log" 2>&1
  export PYTHONPATH=/tmp/site
  python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$L/install.log" 2>&1
fi
T=tests/test_threads.py::test_both_directions_in_threads_equal_the_same_estimate_run_in_one_thread
for i in 1 2 3 4; do
  (timeout 130 python3 -m pytest -q -n 0 -p no:cacheprovider "$T" > "$L/with_$i.log" 2>&1; echo "with flag, run $i: rc $?" >> "$L/rc.txt") &
  (XLA_FLAGS=--xla_gpu_deterministic_ops=false timeout 130 python3 -m pytest -q -n 0 -p no:cacheprovider "$T" > "$L/without_$i.log" 2>&1; echo "flag off, run $i: rc $?" >> "$L/rc.txt") &
done
(timeout 130 python3 -m pytest -q -m "slow or not slow" -n 4 -p no:cacheprovider tests/test_estimator.py -k "held_out or same_key" > "$L/estimator.log" 2>&1; echo "estimator held-out and same-key: rc $?" >> "$L/rc.txt") &
wait
{ sort "$L/rc.txt"; for f in "$L"/*.log; do echo "== $(basename "$f")"; tail -3 "$f"; done; } > "$R/determinism.txt"
tar czf "$R/determinism_logs.tgz" -C "$L" .
cat "$R/determinism.txt"
