"""Each program of a first estimate compiled at XLA:CPU's optimisation levels: compile and run seconds.

One ``estimate_from_samples`` at the library's defaults (Laplace(0, 1) against Laplace(1, 1), Renyi
alpha = 2, ``--n`` samples per side) runs with the program store on, recording each program the store
compiles and the arguments it was called with. Then each program is lowered again and compiled with
``xla_backend_optimization_level`` 0 to 3 (and 1 with ``xla_llvm_disable_expensive_passes``), JAX's
persistent cache set aside; each executable runs ``--repeats`` times on the recorded arguments. Wall
and CPU seconds of the compile, wall and CPU milliseconds per run. This is how the ``quick`` programs
(``programs.QUICK_OPTIONS``) were chosen: a program whose compile the low level shortens and whose
run it barely lengthens, at the sizes where a warm call's time matters.

Usage:
  python benchmarks/compile_levels.py --n 100000 --out DIR/compile_levels.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import numpy as np

from cbdp_jax._src.infra import programs
from cbdp_jax.estimator import estimate_from_samples

LEVEL = "xla_backend_optimization_level"
OPTIONS = {
    "O3": {LEVEL: 3},
    "O2": {LEVEL: 2},
    "O1": {LEVEL: 1},
    "O0": {LEVEL: 0},
    "O1-cheap-llvm": {LEVEL: 1, "xla_llvm_disable_expensive_passes": True},
}
STATICS = (
    "trainer",
    "graphdef",
    "divergence",
    "capacity",
    "objective",
    "div",
    "batch_size",
    "sampler",
)


def record(n: int) -> dict:
    """The programs one estimate compiles: name -> (jitted, args, kwargs) of the first call."""
    seen: dict = {}
    original = programs._load_or_compile

    def spy(jitted, key, args, kwargs):
        seen.setdefault(getattr(jitted, "__name__", str(jitted)), (jitted, args, kwargs))
        return original(jitted, key, args, kwargs)

    programs._load_or_compile = spy
    try:
        rng = np.random.default_rng(0)
        p, q = rng.laplace(0.0, 1.0, n), rng.laplace(1.0, 1.0, n)
        estimate_from_samples(jax.random.key(0), p, q, divergence="renyi", alpha=2.0)
    finally:
        programs._load_or_compile = original
    return seen


def measure(jitted, args, kwargs, options: dict, repeats: int) -> dict:
    lowered = jitted.lower(*args, **kwargs)
    with programs._without_jax_cache():
        w, c = time.perf_counter(), time.process_time()
        compiled = lowered.compile(compiler_options=options)
        compile_s, compile_cpu = time.perf_counter() - w, time.process_time() - c
    dynamic = {k: v for k, v in kwargs.items() if k not in STATICS}
    jax.block_until_ready(compiled(*args, **dynamic))
    w, c = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        jax.block_until_ready(compiled(*args, **dynamic))
    return {
        "compile_s": round(compile_s, 3),
        "compile_cpu_s": round(compile_cpu, 3),
        "run_ms": round((time.perf_counter() - w) / repeats * 1e3, 2),
        "run_cpu_ms": round((time.process_time() - c) / repeats * 1e3, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/compile_levels.json")
    args = ap.parse_args()
    with programs.enabled():
        seen = record(args.n)
    rows = []
    for name, (jitted, a, k) in seen.items():
        for tag, options in OPTIONS.items():
            row = {"program": name, "options": tag, **measure(jitted, a, k, options, args.repeats)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"n_per_side": args.n, "load_1min": os.getloadavg()[0], "rows": rows}
    out.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
