"""Cold start of a library user's call: ``estimate_from_samples`` in a fresh Python process.

The DP-Auditorium case (Laplace(0, 1) against Laplace(1, 1), 100k samples per side, MLP 32x2, Renyi
alpha = 2, 1000 steps, ensemble 2). Prints the import time, the first call's time (tracing, compiling
or loading stored programs) and a warm second call's. Run it twice with a fresh cache folder to see the
first and the second process:

    rm -rf /tmp/cl && for i in 1 2; do CBDP_JAX_CACHE_DIR=/tmp/cl python benchmarks/cold_library.py; done

``CBDP_JAX_PROGRAM_CACHE=0`` measures JAX's compilation cache alone.
"""

import time


def main() -> None:
    """Times the import, the first call and a warm call in this (fresh) process."""
    t0 = time.perf_counter()
    import jax
    import numpy as np

    from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples

    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    p, q = rng.laplace(0.0, 1.0, 100_000), rng.laplace(1.0, 1.0, 100_000)
    config = EstimatorConfig(steps=1000, ensemble=2)

    def call():
        return estimate_from_samples(
            jax.random.key(0), p, q, adversary="mlp", width=32, depth=2, divergence="renyi",
            alpha=2.0, config=config,
        )  # fmt: skip

    r = call()
    t2 = time.perf_counter()
    call()
    t3 = time.perf_counter()
    print(
        f"import {t1 - t0:.1f} s, first call {t2 - t1:.1f} s, warm call {t3 - t2:.1f} s, "
        f"estimate {r.estimate:.6f}, lower bound {r.lower_bound:.6f}"
    )


if __name__ == "__main__":
    main()
