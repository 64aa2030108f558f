#!/usr/bin/env bash
# Creates DP-Auditorium's own virtual environment for benchmarks/vs_dp_auditorium.py.
#
# DP-Auditorium (python/dp_auditorium of https://github.com/google/differential-privacy) is not on the
# package index. Get it with
#     git clone --depth 1 https://github.com/google/differential-privacy
# and pass the clone (or a .tar / .tar.gz of python/dp_auditorium, or a bare git directory) as SOURCE.
# It is never a dependency of cbdp_jax: it lives in its own venv (TensorFlow 2.15 needs numpy < 2).
#
# Usage: benchmarks/peers/dp_auditorium/setup.sh [SOURCE] [VENV]
#   SOURCE  clone / bare git dir / tarball (default: $DPA_SOURCE, else the mirror
#           /work/.mirror/google+differential-privacy/repo when it exists)
#   VENV    where to create the venv (default: $DPA_VENV, else /tmp/dpa-venv)
# Needs python3.11 on PATH (override with $DPA_PYTHON).
set -euo pipefail

SOURCE="${1:-${DPA_SOURCE:-/work/.mirror/google+differential-privacy/repo}}"
VENV="${2:-${DPA_VENV:-/tmp/dpa-venv}}"
PY="${DPA_PYTHON:-python3.11}"
SUB=python/dp_auditorium

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. The package source, as a folder containing setup.py.
if [[ -f "$SOURCE" ]]; then                                   # a tarball
  tar -xf "$SOURCE" -C "$work"
  pkg="$(dirname "$(find "$work" -name setup.py -path '*dp_auditorium*' | head -1)")"
  rev="tarball $(basename "$SOURCE")"
elif git -C "$SOURCE" rev-parse --git-dir >/dev/null 2>&1; then  # a clone or a bare git dir
  git -C "$SOURCE" archive HEAD "$SUB" | tar -x -C "$work"
  pkg="$work/$SUB"
  rev="$(git -C "$SOURCE" rev-parse HEAD)"
else
  echo "error: SOURCE=$SOURCE is neither a git checkout / bare git dir nor a tarball" >&2
  exit 2
fi
[[ -f "$pkg/setup.py" ]] || { echo "error: no setup.py of dp_auditorium under $SOURCE" >&2; exit 2; }

# 2. The venv. TensorFlow 2.15 (CPU) pins numpy < 2; google-vizier and pipeline-dp are imported by
#    dp_auditorium/__init__.py (its dataset generators), not by the Renyi tester itself. The package is
#    installed with --no-deps: its requirements.txt pins jax / flax / equinox only for vizier's optional
#    parts, which nothing here uses.
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "tensorflow-cpu==2.15.1" "numpy>=1.26,<2" "scipy>=1.11,<1.12" \
  "absl-py" "typing-extensions>=4.9" "etils[epath,epy]" \
  "google-vizier==0.1.6" "pipeline-dp" "protobuf<5"
"$VENV/bin/pip" install -q --no-deps "$pkg"

# 3. Check that the tester imports, and record what was installed.
"$VENV/bin/python" - <<PY
import dp_auditorium, numpy, tensorflow as tf
from dp_auditorium.testers import renyi_tester
print("dp_auditorium OK from", dp_auditorium.__file__, "| tensorflow", tf.__version__, "| numpy", numpy.__version__)
PY
echo "$rev" > "$VENV/DP_AUDITORIUM_COMMIT"
"$VENV/bin/pip" freeze > "$VENV/pip-freeze.txt"
echo "DP-Auditorium venv ready: $VENV (source commit: $rev)"
