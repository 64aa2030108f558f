"""Wall time of one sweep grid as 1 process x 1 device, 1 process x 4 devices and 2 processes x 2 devices.

Each configuration runs as a fresh ``cbdp sweep`` command (compilation included; the persistent
compilation cache is switched off so no run reuses another's programs), the same grid and key, and the
tables are compared. Runs with the same number of devices (1 x 4 and 2 x 2) run the same per-device
program and agree to float rounding; a different device count changes the per-device program (8 or 2
members per device), whose rounding differs, and training (500 steps of a ReLU network, early stopping)
can amplify that to ~1e-3 in an estimate, well inside its standard error. On a 2-core CPU no speedup is expected -- the
four virtual devices share the same two cores, and two processes add gloo start-up, a coordination
service and a second compilation of every program.

    python benchmarks/distributed.py --out benchmarks/results/distributed.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cbdp_jax._src.infra.io import atomic_write_json, environment_info

ROOT = Path(__file__).resolve().parents[1]
GRID = [
    "--epsilon", "0.5,1,2", "--adversary", "relu2", "--width", "16", "--divergence", "renyi",
    "--alpha", "2,4", "--seeds", "4", "--steps", "500", "--eval-every", "50",
    "--batch-size", "1024", "--val-samples", "4096", "--test-samples", "50000",
    "--eval-chunk", "10000",
]  # fmt: skip
CONFIGS = {
    "1 process x 1 device": ["--devices-per-process", "1"],
    "1 process x 4 devices": ["--devices-per-process", "4"],
    "2 processes x 2 devices": ["--processes", "2", "--devices-per-process", "2"],
}


def run_one(label: str, extra: list[str], out: Path) -> dict:
    """One fresh ``cbdp sweep`` command; returns its wall time, in-job time and table."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "CBDP_JAX_COMPILATION_CACHE": "0"}  # fmt: skip
    cmd = [sys.executable, "-m", "cbdp_jax.cli", "sweep", *GRID, "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{label} failed:\n{proc.stderr}")
    record = json.loads((out / "sweep.json").read_text())
    return {
        "label": label,
        "command": "cbdp sweep " + " ".join(GRID + extra),
        "wall_seconds": round(wall, 1),
        "job_seconds": round(record["seconds"], 1),
        "processes": record["processes"],
        "devices": record["devices"],
        "estimates": [r["estimate"] for r in record["rows"]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/distributed.json", help="JSON output file")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cbdp-dist-"))
    try:
        runs = [run_one(k, v, tmp / str(i)) for i, (k, v) in enumerate(CONFIGS.items())]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    one, four = (np.array(runs[i]["estimates"]) for i in (0, 1))
    for r in runs:
        est = np.array(r["estimates"])
        r["max_abs_diff_vs_1x1"] = float(np.max(np.abs(est - one)))
        r["max_abs_diff_vs_1x4"] = float(np.max(np.abs(est - four)))
        print(f"{r['label']:>24}: {r['wall_seconds']:6.1f} s wall, {r['job_seconds']:6.1f} s in "
              f"the job; max |estimate diff| vs 1x1 {r['max_abs_diff_vs_1x1']:.1e}, "
              f"vs 1x4 {r['max_abs_diff_vs_1x4']:.1e}")  # fmt: skip
    result = {"environment": environment_info(), "cpu_cores": os.cpu_count(), "runs": runs,
              "members": len(one)}  # fmt: skip
    atomic_write_json(args.out, result)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
