"""The DP-Auditorium comparison case: Laplace eps = 1, unrestricted-capacity (MLP) adversary, Renyi.

P = Lap(0, 1), Q = Lap(1, 1); 100,000 training and 100,000 held-out test samples per side (plus 25,000
validation samples per side for early stopping, member selection and the choice of the critic bound B);
Renyi alpha = 2 (true 0.6191) and alpha = 4 (true 0.8137). For each guarantee -- finite-sample (the
critic B tanh(h / B), no assumption) and asymptotic (CLT, tail-checked) -- reports the held-out
estimate, the one-sided 95% lower bound, its kind and method, and the cold (first call, compilation
included) and warm wall times of the same call on this machine. With ``--curve`` it also measures the
warm time and the finite-sample bound over a schedule of training budgets (steps x ensemble): the
time-versus-bound curve.

Usage: python benchmarks/auditorium_case.py [--out DIR] [--steps 1000] [--width 32] [--curve]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from cbdp_jax import analytic
from cbdp_jax._src.infra.io import atomic_write_json, environment_info
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples

N_TRAIN = N_TEST = 100_000
N_VAL = 25_000
CURVE = ((100, 1), (250, 1), (500, 1), (500, 2), (1000, 2), (2000, 2), (2000, 4))


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    rng = np.random.default_rng(seed)
    total = N_TRAIN + N_VAL + N_TEST
    p, q = rng.laplace(0.0, 1.0, total), rng.laplace(1.0, 1.0, total)
    return p, q, (N_TRAIN / total, N_VAL / total, N_TEST / total)


def one(p, q, split, *, alpha, guarantee, steps, width, depth, ensemble, batch, seed=0, repeats=2):
    """Times the same call ``repeats`` times (the first compiles); returns the last result and times."""
    cfg = EstimatorConfig(
        steps=steps,
        ensemble=ensemble,
        batch_size=batch,
        learning_rate=3e-3,
        split=split,
        guarantee=guarantee,
    )
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = estimate_from_samples(
            jax.random.key(seed),
            p,
            q,
            adversary="mlp",
            width=width,
            depth=depth,
            divergence="renyi",
            alpha=alpha,
            config=cfg,
        )
        times.append(time.perf_counter() - t0)
    return res, times


def run(steps: int, width: int, depth: int, ensemble: int, batch: int, seed: int = 0) -> list[dict]:
    p, q, split = data(seed)
    rows = []
    for alpha in (2.0, 4.0):
        truth = analytic.laplace_renyi(alpha, 1.0)
        for guarantee in ("finite-sample", "asymptotic"):
            res, times = one(
                p,
                q,
                split,
                alpha=alpha,
                guarantee=guarantee,
                steps=steps,
                width=width,
                depth=depth,
                ensemble=ensemble,
                batch=batch,
                seed=seed,
            )
            rows.append(
                {
                    "alpha": alpha,
                    "true_renyi": truth,
                    "guarantee": res.guarantee,
                    "bound_method": res.bound_method,
                    "bounds": res.bounds,
                    "estimate": res.estimate,
                    "lower_bound_95": res.lower_bound,
                    "bound_reliable": res.bound_reliable,
                    "std_error": res.std_error,
                    "critic_bound": res.critic_bound,
                    "lower_bound_below_truth": res.lower_bound <= truth,
                    "cold_seconds": times[0],
                    "warm_seconds": times[-1],
                    "samples": res.samples,
                    "warnings": list(res.warnings),
                }
            )
            print(
                f"alpha={alpha:g} {guarantee:13s}: estimate {res.estimate:.4f}, 95% lower bound "
                f"{res.lower_bound:.4f} ({res.bound_method}; true {truth:.4f}), SE "
                f"{res.std_error:.4f}; cold {times[0]:.1f} s, warm {times[-1]:.2f} s",
                flush=True,
            )
    return rows


def curve(width: int, depth: int, batch: int, seed: int = 0) -> list[dict]:
    """Warm time and finite-sample bound over growing training budgets (the time-versus-bound curve)."""
    p, q, split = data(seed)
    rows = []
    for alpha in (2.0, 4.0):
        for steps, ensemble in CURVE:
            res, times = one(
                p,
                q,
                split,
                alpha=alpha,
                guarantee="finite-sample",
                steps=steps,
                width=width,
                depth=depth,
                ensemble=ensemble,
                batch=batch,
                seed=seed,
            )
            rows.append(
                {
                    "alpha": alpha,
                    "steps": steps,
                    "ensemble": ensemble,
                    "warm_seconds": times[-1],
                    "lower_bound_95": res.lower_bound,
                    "estimate": res.estimate,
                    "bound_method": res.bound_method,
                }
            )
            print(
                f"curve alpha={alpha:g} steps={steps:5d} ensemble={ensemble}: warm "
                f"{times[-1]:.2f} s, finite-sample bound {res.lower_bound:.4f}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--ensemble", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--curve", action="store_true", help="also the time-versus-bound curve")
    args = parser.parse_args()
    rows = run(args.steps, args.width, args.depth, args.ensemble, args.batch)
    curve_rows = curve(args.width, args.depth, args.batch) if args.curve else []
    env = environment_info()
    atomic_write_json(
        args.out / f"auditorium_case_{env['platform']}.json",
        {
            "benchmark": "auditorium_case",
            "settings": vars(args) | {"out": str(args.out)},
            "rows": rows,
            "curve": curve_rows,
            "environment": env,
        },
    )


if __name__ == "__main__":
    main()
