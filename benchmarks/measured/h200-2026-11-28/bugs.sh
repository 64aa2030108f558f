#!/usr/bin/env bash
# Third call of the 2026-11-28 GPU session: the ghost-clipping tests again (after the TF32 fix), and
# benchmarks/training_bugs.py (every planted bug x every threat, the rest at the command line's
# defaults, 10^4 runs per side) as one process per bug side by side; merged on the workstation with
#   python benchmarks/training_bugs.py --merge bugs_*.json --out benchmarks/measured/training-bugs/summary.json
set -u
R=${OUT:-/tmp/res}; mkdir -p "$R/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$R/logs/install.log" 2>&1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . >> "$R/logs/install.log" 2>&1
echo "[$(date +%T)] installed" >> "$R/progress.txt"
timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_ghost_clipping.py > "$R/ghost_tests.log" 2>&1 &
for bug in $(python3 -c "from cbdp_jax.training_audit import BUGS; print(' '.join(BUGS))"); do
  timeout "${BUGS_TIMEOUT:-210}" python3 benchmarks/training_bugs.py --device gpu --bugs "$bug" \
    --out "$R/bugs_$bug.json" > "$R/logs/bugs_$bug.log" 2>&1 &
done
wait
echo "[$(date +%T)] done; ghost tests: $(tail -1 "$R/ghost_tests.log")" >> "$R/progress.txt"
