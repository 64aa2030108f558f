"""Where a warm ``estimate_from_samples`` call spends its time: cProfile of one call (issue 26).

The DP-Auditorium case at N samples per side in all (Laplace(0, 1) against Laplace(1, 1), split 4/9
train, 1/9 validation, 4/9 test; MLP 32x2, Renyi 2, finite-sample bound, 1000 steps, ensemble 2, batch
2048, learning rate 3e-3, as benchmarks/auditorium_case.py). One cold call, one timed warm call (wall
and CPU seconds), then a profiled warm call (the two directions one after the other, since the
profiler sees one thread): the library's functions by cumulative time. Time spent
waiting for a compiled program shows as ``numpy.asarray`` under the function that called it.

``--settings case`` / ``short`` take the configuration of ``vs_dp_auditorium.py``'s profiles instead
(both directions, 1000 steps x 2 adversaries or 300 steps x 1); ``--repeats k`` times k warm calls.

Usage: python benchmarks/profile_warm.py [--samples 1000000] [--top 30] [--settings single|case|short]
       [--repeats k] [--from-file SAMPLES.npz]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--samples", type=int, default=1_000_000, help="train + validation + test per side"
    )
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--settings", choices=("single", "case", "short"), default="single")
    ap.add_argument("--repeats", type=int, default=1, help="warm calls timed (median reported)")
    ap.add_argument(
        "--from-file",
        help="a saved sample pair (.npz with p and q, e.g. vs_dp_auditorium's mean-v2 draw) "
        "instead of the Laplace case; --samples is then ignored",
    )
    args = ap.parse_args()
    if args.from_file:
        data = np.load(args.from_file)
        p, q = data["p"].reshape(-1), data["q"].reshape(-1)
    else:
        rng = np.random.default_rng(0)
        p, q = rng.laplace(0.0, 1.0, args.samples), rng.laplace(1.0, 1.0, args.samples)
    if args.settings == "single":
        cfg = EstimatorConfig(
            steps=1000, ensemble=2, batch_size=2048, learning_rate=3e-3,
            split=(4 / 9, 1 / 9, 4 / 9), guarantee="finite-sample",
        )  # fmt: skip
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from vs_dp_auditorium import PROFILES

        cfg = EstimatorConfig(**PROFILES[args.settings])

    def call():
        return estimate_from_samples(
            jax.random.key(0), p, q, adversary="mlp", width=32, depth=2, divergence="renyi",
            alpha=2.0, config=cfg,
        )  # fmt: skip

    t0 = time.perf_counter()
    call()
    print(f"cold {time.perf_counter() - t0:.2f} s")
    walls, cpus = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = call()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    print(
        f"warm {statistics.median(walls):.3f} s wall (median of {args.repeats}: "
        f"{', '.join(f'{w:.3f}' for w in walls)}), {statistics.median(cpus):.3f} s CPU; "
        f"load {os.getloadavg()[0]:.1f}; bound {res.lower_bound:.6g}"
    )
    # cProfile sees only its own thread, so the profiled call runs the two directions one after
    # the other (the timed calls above ran them side by side): its times are their sum.
    from cbdp_jax._src.infra import threads

    side_by_side = threads.map_concurrently
    threads.map_concurrently = lambda fn, items, **kw: side_by_side(fn, items, concurrent=False)
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    threads.map_concurrently = side_by_side
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats("cbdp_jax|asarray", args.top)


if __name__ == "__main__":
    main()
