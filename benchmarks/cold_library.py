"""Cold start of a library user's call: ``estimate_from_samples`` in a fresh Python process.

Prints the import time, the first call's time (tracing, compiling or loading stored programs) and a
warm second call's, with the XLA compilations the first call made (count and seconds, from JAX's
monitoring events) and its CPU seconds. Run it twice with a fresh cache folder to see the first and
the second process:

    rm -rf /tmp/cl && for i in 1 2; do CBDP_JAX_CACHE_DIR=/tmp/cl python benchmarks/cold_library.py; done

``--settings case`` (default): the DP-Auditorium case (Laplace(0, 1) against Laplace(1, 1), MLP
32x2, Renyi alpha = 2, 1000 steps, ensemble 2). ``--settings default``: ``EstimatorConfig()`` and the
default class, what a user who tunes nothing gets. ``--samples`` sets the size per side (default
100k). ``--log`` lists each compiled program with its seconds. ``CBDP_JAX_PROGRAM_CACHE=0`` measures
JAX's compilation cache alone.
"""

import argparse
import time


def main() -> None:
    """Times the import, the first call and a warm call in this (fresh) process."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--settings", choices=("case", "default"), default="case")
    ap.add_argument("--log", action="store_true", help="list the compiled programs")
    args = ap.parse_args()
    t0 = time.perf_counter()
    import jax
    import numpy as np

    from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples

    t_import = time.perf_counter() - t0
    compiles: list[float] = []

    def listen(event: str, seconds: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    if args.log:
        jax.config.update("jax_log_compiles", True)
    rng = np.random.default_rng(0)
    p, q = rng.laplace(0.0, 1.0, args.samples), rng.laplace(1.0, 1.0, args.samples)
    if args.settings == "case":
        config, options = EstimatorConfig(steps=1000, ensemble=2), {"width": 32, "depth": 2}
    else:
        config, options = EstimatorConfig(), {}

    def call(seed: int):
        return estimate_from_samples(
            jax.random.key(seed), p, q, divergence="renyi", alpha=2.0, config=config, **options
        )

    c0, t1 = time.process_time(), time.perf_counter()
    r = call(0)
    t2, c1 = time.perf_counter(), time.process_time()
    first_compiles = list(compiles)
    call(1)
    t3 = time.perf_counter()
    print(
        f"{args.settings} n={args.samples}: import {t_import:.1f} s, first call {t2 - t1:.2f} s "
        f"({c1 - c0:.2f} CPU-s; {len(first_compiles)} XLA compilations, "
        f"{sum(first_compiles):.2f} s), warm call {t3 - t2:.2f} s, estimate {r.estimate:.6f}, "
        f"lower bound {r.lower_bound:.6f}, steps {r.config.get('steps')}"
    )


if __name__ == "__main__":
    main()
