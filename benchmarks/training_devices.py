"""Training runs over devices and processes: the same scores, and runs per second, side by side.

One problem (logistic regression on 1,000 digits, Poisson q = 0.01, T = 100, the library's DP-SGD,
the gradient canary: the setting of training_throughput.py), ``--runs`` trainings with the same key
in three layouts, each in its own process(es) so that JAX's device count is set before it starts:

* one process, one CPU device;
* one process, two CPU devices (``--xla_force_host_platform_device_count=2``);
* two processes of one device each, joined by ``jax.distributed`` (cbdp_jax._src.infra.launch, gloo).

Each layout runs the trainings twice (the first compiles; the second, with another key, is
timed), then once more with the reference key; the scores of that last call are compared with the
one-device ones (largest relative difference). On a machine with fewer free cores than devices the
layouts share the same cores, so runs per second measure the overhead, not a speed-up.

    python benchmarks/training_devices.py --runs 4000 \\
        --out benchmarks/measured/training-devices/summary.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = dict(model="logreg", data="digits", n=1000, sampler="poisson", rate=0.01, steps=100,
               noise=1.0, chunk=2048)  # fmt: skip


def worker(out: str, runs: int) -> None:
    from cbdp_jax._src.infra.launch import ProcessSpec, exit_with_launcher, initialize

    spec = ProcessSpec.from_env()
    if spec is not None:
        initialize(spec)
        exit_with_launcher()
    import jax
    import numpy as np

    from cbdp_jax import training_audit as ta

    problem = ta.build_problem(**PROBLEM)
    prep = ta.prepare(problem)
    t0 = time.perf_counter()
    ta.training_runs(jax.random.key(1), problem, runs, prep=prep)  # compiles
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ta.training_runs(jax.random.key(2), problem, runs, prep=prep)
    seconds = time.perf_counter() - t0
    scores = ta.training_runs(jax.random.key(0), problem, runs, prep=prep).score
    if jax.process_index() == 0:
        np.save(out, scores)
        Path(out).with_suffix(".json").write_text(json.dumps({
            "devices": len(jax.devices()), "processes": jax.process_count(),
            "first_call_seconds": first, "seconds": seconds, "runs_per_second": runs / seconds,
        }))  # fmt: skip


def _layout(name: str, runs: int, tmp: Path) -> dict:
    from cbdp_jax.distributed import launch

    out = tmp / f"{name}.npy"
    argv = [str(Path(__file__).resolve()), "--worker", str(out), "--runs", str(runs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    if name == "2 processes x 1 device":
        launch(argv, 2, devices_per_process=1, log_dir=tmp / "logs", timeout=3600,
               env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})  # fmt: skip
    else:
        if name == "1 process x 2 devices":
            env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        subprocess.run([sys.executable, *argv], env=env, check=True, timeout=3600)
    return {"layout": name, **json.loads(out.with_suffix(".json").read_text()), "file": out}


def main() -> None:
    import _common
    import numpy as np

    p = _common.parser(__doc__.splitlines()[0], "benchmarks/measured/training-devices/summary.json")
    p.add_argument("--runs", type=int, default=4000)
    p.add_argument("--worker", default=None, help=argparse_hidden())
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.runs)
        return
    if args.quick:
        args.runs = min(args.runs, 500)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        names = ("1 process x 1 device", "1 process x 2 devices", "2 processes x 1 device")
        rows = [_layout(n, args.runs, Path(tmp)) for n in names]
        ref = np.load(rows[0]["file"])
        for r in rows:
            s = np.load(r.pop("file"))
            r["max_relative_difference"] = float(
                np.max(np.abs(s - ref) / np.maximum(np.abs(ref), 1e-6))
            )
            r["ratio_to_one_device"] = r["runs_per_second"] / rows[0]["runs_per_second"]
    _common.print_table(f"{args.runs} trainings, same key", rows, list(rows[0]))
    _common.write(args.out, "training_devices", args,
                  {"problem": PROBLEM, "runs": args.runs, "load_before": list(load),
                   "load_after": list(os.getloadavg()), "rows": rows})  # fmt: skip


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
