"""Which score for which one-run method: gradient canaries under Poisson sampling, simulated exactly.

A coordinate canary (a coordinate no example moves) of a plain DP-SGD step sees, at step t, the
update z_t = b_t + S N(0, 1) in units of a lone canary's move, where b_t = 1 if its batch held it
(Poisson, rate q, only when it is included) and S is the noise multiplier. That is exactly what
``one_run_training`` records for coordinate canaries (the excluded scores' spread is 0.98-1.04 of
S sqrt(T) on the digits runs, benchmarks/measured/one-run-training/), so this simulation is the
real runs' law without the model around it, and it reaches m = 10,000, which the digits' three
blank pixels cannot hold (1,200 coordinates at 400 hidden units).

Scores: ``sum`` (sum_t z_t), ``llr`` (sum_t log(1 - q + q exp((2 z_t - 1) / (2 S^2))), the
likelihood ratio, sufficient for the in/out pair), ``count`` (steps with z_t > 2.5 S), and, as a
reference for the bounds alone, ``gauss``: N(mu, 1) scores at the sum's fitted mu.

Ceilings (the median any finite-sample method valid for every mechanism can reach at m, section 3b
of docs/theory/one_run.md), at three privacy curves: the Gaussian at the sum's fitted mu (a bound
for methods on the sum, whose pair is that Gaussian up to a Binomial mixture of its mean), the
Gaussian at the accountant's GDP mu (eps_G(mu) = the accountant's eps at delta), and the
mechanism's own curve (the PLD accountant's delta(eps): a bound for every score, the llr included).

  python benchmarks/one_run_score_choice.py --runs 9 --m 1000 10000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import optimize

from cbdp_jax._src.infra.io import git_commit
from cbdp_jax._src.privacy.accounting import dpsgd_delta, dpsgd_epsilon, dpsgd_noise
from cbdp_jax.audit import gdp_delta
from cbdp_jax.one_run import gdp_epsilon, one_run_audit

OUT = Path(__file__).parent / "measured" / "one-run-training" / "score-choice.json"
Q, T, DELTA, BETA = 0.01, 1000, 1e-5, 0.05


def ceiling(delta_of, m: int) -> float:
    """Median ceiling: the eps where beta + 1 - (1 - e^-eps delta(eps))^m = 1/2 (section 3b)."""
    cap = lambda e: min(1.0, BETA + 1.0 - (1.0 - math.exp(-e) * delta_of(e)) ** m) - 0.5
    return optimize.brentq(cap, 0.01, 60.0) if cap(0.01) > 0 else 0.0


def scores(rng, m: int, s: float) -> tuple[dict, np.ndarray]:
    inc = rng.random(m) < 0.5
    z = np.empty((T, m), np.float32)
    for t in range(T):  # row by row: [T, m] float32 at m = 10^4 is 40 MB
        z[t] = (rng.random(m) < Q) * inc + s * rng.standard_normal(m, dtype=np.float32)
    a = (2.0 * z - 1.0) / (2.0 * s * s)
    llr = np.logaddexp(math.log1p(-Q), math.log(Q) + a).sum(0)
    count = (z > 2.5 * s).sum(0) + 1e-6 * rng.random(m)  # ties broken at random (not by S)
    return {"sum": z.sum(0, dtype=np.float64), "llr": llr, "count": count}, inc


def one_setting(eps: float, m: int, runs: int, seed: int) -> dict:
    s = dpsgd_noise(eps, DELTA, Q, T)
    rng = np.random.default_rng([seed, int(eps * 10), m])
    got: dict[str, list] = {}
    for _ in range(runs):
        sc, inc = scores(rng, m, s)
        mu = (sc["sum"][inc].mean() - sc["sum"][~inc].mean()) / sc["sum"][~inc].std(ddof=1)
        sc["gauss"] = rng.standard_normal(m) + mu * inc
        got.setdefault("mu_fitted", []).append(mu)
        for name, v in sc.items():
            for method in ("steinke", "fdp"):
                b = one_run_audit(v, inc, delta=DELTA, level=1 - BETA, method=method)
                got.setdefault(f"{method}/{name}", []).append(b.epsilon)
        g = one_run_audit(sc["sum"], inc, delta=DELTA, level=1 - BETA, method="gaussian-scores")
        got.setdefault("gaussian-scores/sum", []).append(g.epsilon)
    med = {k: float(np.median(v)) for k, v in got.items()}
    mu_acc = optimize.brentq(lambda u: gdp_epsilon(u, DELTA) - eps, 1e-3, 30.0)
    ceil = {
        "fitted_mu": ceiling(lambda e: gdp_delta(med["mu_fitted"], e), m),
        "accountant_mu": ceiling(lambda e: gdp_delta(mu_acc, e), m),
        "mechanism": ceiling(lambda e: dpsgd_delta(s, Q, T, e), m),
    }
    best = max(med[f"{k}/{n}"] for k in ("steinke", "fdp") for n in ("sum", "llr", "count"))
    return {
        "eps_target": eps, "claim": dpsgd_epsilon(s, Q, T, DELTA), "noise_multiplier": s,
        "m": m, "runs": runs, "accountant_gdp_mu": mu_acc, "median": med, "ceiling": ceil,
        "ratio_best_finite_to": {k: best / v for k, v in ceil.items()},
        "ratio_fdp_sum_to_fitted_mu_ceiling": med["fdp/sum"] / ceil["fitted_mu"],
        "ratio_fdp_gauss_to_fitted_mu_ceiling": med["fdp/gauss"] / ceil["fitted_mu"],
        "ratio_fdp_llr_to_mechanism_ceiling": med["fdp/llr"] / ceil["mechanism"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--m", type=int, nargs="+", default=[1000])
    ap.add_argument("--eps", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    start, rows = time.perf_counter(), []
    for m in args.m:
        for eps in args.eps:
            rows.append(one_setting(eps, m, args.runs, args.seed))
            print(json.dumps(rows[-1]), flush=True)
            meta = {"command": " ".join(["python", "benchmarks/one_run_score_choice.py",
                                         *sys.argv[1:]]),
                    "seconds": time.perf_counter() - start, "load": os.getloadavg(),
                    "commit": git_commit(), "q": Q, "steps": T, "delta": DELTA,
                    "level": 1 - BETA}  # fmt: skip
            OUT.parent.mkdir(
                parents=True, exist_ok=True
            )  # after every row: a cut run keeps its rows
            OUT.write_text(json.dumps({"rows": rows, "meta": meta}, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
