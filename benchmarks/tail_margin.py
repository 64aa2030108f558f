"""What a stricter tail check buys on the estimator's path: coverage of its asymptotic bound by tail margin.

The coverage benchmark (``coverage.py``) runs the sweep; this script runs ``estimate``. On a cone both
shrink the critic on validation data to t * h until both terms' tail indices clear 2 + ``tail_margin``
(docs/theory/bounds.md, "A certified member instead"), and certify that member. This script measures
the estimator's path on one case, for several margins, over ``--runs`` independent keys: for each run
the 95% asymptotic lower bound, whether it was certified, the shrink t, and whether the bound lies below
the exact restricted value D^H (refusals, whose reported bound is 0, count as covered). Per margin:
coverage with its Wilson interval, certified fraction, the mean bound over D^H, and the mean shrink of
the certified runs.

Settings match the coverage benchmark's linear class (600 Adam steps, batch 2048, step size 1e-2,
100k training / 8,192 validation / 100k test samples per side), with one ensemble member.

    python benchmarks/tail_margin.py --epsilon 1 --margins 0,0.5 --runs 1000   # ~6 min on 2 cores
"""

from __future__ import annotations

import time

import _common
import jax
import numpy as np

from cbdp_jax import exact
from cbdp_jax.estimator import EstimatorConfig, estimate
from cbdp_jax.mechanisms import LaplaceMechanism


def config(margin: float) -> EstimatorConfig:
    return EstimatorConfig(
        steps=600,
        eval_every=100,
        batch_size=2048,
        learning_rate=1e-2,
        ensemble=1,
        guarantee="asymptotic",
        tail_margin=margin,
    )


def one_run(key, eps: float, margin: float, truth: float) -> dict:
    res = estimate(
        key,
        LaplaceMechanism(epsilon=eps),
        samples=100_000,
        val_samples=8192,
        test_samples=100_000,
        adversary="linear",
        divergence="kl",
        config=config(margin),
    )
    return {
        "estimate": res.estimate,
        "lower_bound": res.lower_bound,
        "certified": bool(res.bound_reliable),
        "tail_shrink": res.tail_shrink,
        "covered": bool(res.lower_bound <= truth),
    }


def summarise(rows: list[dict], truth: float) -> dict:
    n = len(rows)
    covered = sum(r["covered"] for r in rows)
    cert = [r for r in rows if r["certified"]]
    return {
        "runs": n,
        "coverage": covered / n,
        "coverage_interval_95": _common.wilson(covered, n),
        "certified_fraction": len(cert) / n,
        "mean_bound_over_truth": float(np.mean([r["lower_bound"] for r in rows])) / truth,
        "mean_shrink_certified": float(np.mean([r["tail_shrink"] for r in cert])) if cert else None,
        "missed_and_certified": sum(r["certified"] and not r["covered"] for r in rows) / n,
    }


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "benchmarks/results/tail_margin.json")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--margins", default="0,0.5", help="comma-separated tail margins")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    backend = _common.setup_device(args.device)
    runs = 20 if args.quick else args.runs
    truth = exact.restricted_divergence(exact.laplace_pair(args.epsilon), "kl").value
    margins = [float(m) for m in args.margins.split(",")]
    keys = jax.random.split(jax.random.key(args.seed), runs)  # the same keys for every margin
    out, t0 = {}, time.perf_counter()
    for m in margins:
        rows = [one_run(k, args.epsilon, m, truth) for k in keys]
        out[str(m)] = {"summary": summarise(rows, truth), "records": rows}
        s = out[str(m)]["summary"]
        print(
            f"margin {m}: coverage {s['coverage']:.3f} {np.round(s['coverage_interval_95'], 3)}, "
            f"certified {s['certified_fraction']:.3f}, bound/truth {s['mean_bound_over_truth']:.3f}, "
            f"shrink {s['mean_shrink_certified']}, certified and missed {s['missed_and_certified']:.3f}"
            f" | {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    payload = {
        "epsilon": args.epsilon,
        "truth": truth,
        "runs": runs,
        "seed": args.seed,
        "margins": out,
        "device_backend": backend,
    }
    _common.write(args.out, "tail_margin", args, payload)


if __name__ == "__main__":
    main()
