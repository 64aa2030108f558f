"""Coverage of the one-run ``'gaussian-scores'`` bound, and where its Gaussian model fails.

Each case draws, 200 times, m canaries (each included with probability 1/2) and one score per canary
from a pair of score laws whose exact privacy is computed here: the truth is the pair's eps at delta
(for an (eps, delta) lower bound on the mechanism the pair's eps is the strictest target: the
mechanism's eps is at least it, docs/theory/one_run.md section 3b). Per case: how often the method
refused the scores, the mean bound over the runs it did not refuse, and the share of all runs in which
the bound exceeded the truth (at most beta = 5% where the model holds).

Cases: Gaussian pairs of equal variance (mu = 0, 1, 2; m = 10^3, 10^4: the coverage study), of
unequal variance (the bound uses the larger standard deviation), the canary-direction sum of
Poisson-subsampled DP-SGD (T steps of rate q and noise sigma: in-scores a Binomial(T, q) mixture of
Gaussians, nearly Gaussian), and the failures the normality check is for: Laplace noise (eps = 1),
Student t scores (heavier tails than the model: bounded privacy loss), randomized response (binary).

  python benchmarks/one_run_gaussian_scores.py            # about a minute
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import time
import zlib
from pathlib import Path

import numpy as np
from scipy import optimize, special, stats

from cbdp_jax import InvalidParameterError, one_run
from cbdp_jax._src.infra.io import git_commit

OUT = Path(__file__).parent / "measured" / "one-run" / "gaussian_scores.json"
LEVEL, DELTA = 0.95, 1e-5


def _pair_delta(logp, logq, grid, eps: float) -> float:
    """max over the two directions of int (p - e^eps q)_+ on a fine grid (trapezoid rule)."""
    out = 0.0
    for a, b in ((logp, logq), (logq, logp)):
        integrand = np.exp(a) * -np.expm1(np.minimum(eps - (a - b), 0.0))
        out = max(out, float(np.trapezoid(integrand, grid)))
    return out


def pair_epsilon(logp, logq, grid, delta: float) -> float:
    """The pair's eps at ``delta``: the root of delta(eps) = delta (bisection on [0, 80])."""
    if _pair_delta(logp, logq, grid, 0.0) <= delta:
        return 0.0
    return optimize.brentq(lambda e: _pair_delta(logp, logq, grid, e) - delta, 0.0, 80.0, xtol=1e-6)


def _dpsgd_in_logpdf(y, steps: int, rate: float, noise: float):
    """log density of sum_t (B_t + N(0, sigma^2)), B_t ~ Bernoulli(q): the in-canary's score."""
    k = np.arange(0, int(stats.binom.ppf(1 - 1e-15, steps, rate)) + 1)
    logw = stats.binom.logpmf(k, steps, rate)
    sd = noise * math.sqrt(steps)
    return special.logsumexp(logw[:, None] + stats.norm.logpdf(y[None, :], k[:, None], sd), axis=0)


def accountant_epsilon(steps: int, rate: float, noise: float, delta: float) -> float:
    """The mechanism's eps at delta (dp_accounting's PLD accountant, add/remove)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(noise))
    acc = pld_privacy_accountant.PLDAccountant().compose(event, steps)
    return float(acc.get_epsilon(delta))


def cases() -> list[dict]:
    out = []
    for mu in (0.0, 1.0, 2.0):
        for m in (1000, 10_000):
            out.append({"name": f"gauss mu={mu:g}", "kind": "gauss", "mu": mu, "m": m})
    for s_in in (1.5, 0.67):
        out.append(
            {"name": f"gauss mu=2 sd_in={s_in}", "kind": "hetero", "s_in": s_in, "m": 10_000}
        )
    out.append({"name": "dpsgd-sum T=1000 q=0.01 s=1", "kind": "dpsgd", "m": 10_000,
                "steps": 1000, "rate": 0.01, "noise": 1.0})  # fmt: skip
    for m in (1000, 10_000):
        out.append({"name": "laplace eps=1", "kind": "laplace", "m": m})
    for nu in (30, 10):
        for m in (1000, 10_000):
            out.append({"name": f"student-t nu={nu} shift 2", "kind": "t", "nu": nu, "m": m})
    out.append({"name": "rr eps=1", "kind": "rr", "m": 1000})
    return out


def truth_and_sampler(case: dict):
    """(the pair's eps at DELTA, its separation theta = (a - b) / max sd, sampler(rng, inc))."""
    kind = case["kind"]
    if kind == "gauss":
        mu = case["mu"]
        return one_run.gdp_epsilon(mu, DELTA), mu, lambda r, inc: r.normal(size=inc.size) + mu * inc
    grid = np.linspace(-60.0, 60.0, 2_400_001)
    if kind == "hetero":
        s_in = case["s_in"]
        logp, logq = stats.norm.logpdf(grid, 2.0, s_in), stats.norm.logpdf(grid, 0.0, 1.0)
        theta = 2.0 / max(s_in, 1.0)
        return pair_epsilon(logp, logq, grid, DELTA), theta, (
            lambda r, inc: np.where(inc, 2.0 + s_in * r.normal(size=inc.size), r.normal(size=inc.size))
        )  # fmt: skip
    if kind == "dpsgd":
        t, q, s = case["steps"], case["rate"], case["noise"]
        sd = s * math.sqrt(t)
        grid = np.linspace(-12 * sd, 12 * sd + t * q * 4, 600_001)
        logp, logq = _dpsgd_in_logpdf(grid, t, q, s), stats.norm.logpdf(grid, 0.0, sd)
        theta = t * q / math.sqrt(t * s**2 + t * q * (1 - q))
        case["accountant_epsilon"] = accountant_epsilon(t, q, s, DELTA)

        def draw(r, inc):
            return r.binomial(t, q, size=inc.size) * inc + sd * r.normal(size=inc.size)

        return pair_epsilon(logp, logq, grid, DELTA), theta, draw
    if kind == "laplace":  # Laplace(0, 1) shifted by 1: 1-DP, a little less at delta > 0
        logp, logq = stats.laplace.logpdf(grid, 1.0), stats.laplace.logpdf(grid, 0.0)
        return (
            pair_epsilon(logp, logq, grid, DELTA),
            1.0 / math.sqrt(2.0),
            lambda r, inc: r.laplace(size=inc.size) + 1.0 * inc,
        )
    if kind == "t":
        nu = case["nu"]
        grid = np.linspace(-400.0, 400.0, 4_000_001)
        logp, logq = stats.t.logpdf(grid, nu, 2.0), stats.t.logpdf(grid, nu, 0.0)
        theta = 2.0 / math.sqrt(nu / (nu - 2.0))
        return pair_epsilon(logp, logq, grid, DELTA), theta, (
            lambda r, inc: r.standard_t(nu, size=inc.size) + 2.0 * inc
        )  # fmt: skip
    eps_rr = 1.0

    def rr(r, inc):
        keep = r.random(inc.size) < 1.0 / (1.0 + math.exp(-eps_rr))
        return np.where(keep, inc, ~inc).astype(np.float64)

    return math.log(math.exp(eps_rr) - DELTA * (1 + math.exp(eps_rr))), math.nan, rr


def run_case(case: dict, repeats: int, seed: int) -> dict:
    truth, theta, draw = truth_and_sampler(case)
    rng = np.random.default_rng([seed, case["m"], zlib.crc32(case["name"].encode())])
    eps, mus, refused, over, reasons = [], [], 0, 0, collections.Counter()
    start = time.perf_counter()
    for _ in range(repeats):
        inc = rng.random(case["m"]) < 0.5
        try:
            b = one_run.one_run_audit(
                draw(rng, inc), inc, delta=DELTA, level=LEVEL, method="gaussian-scores"
            )
        except InvalidParameterError as e:
            refused += 1
            reasons[re.split(r" \(|:", str(e))[0]] += 1
            continue
        eps.append(b.epsilon)
        mus.append(b.gdp_mu)
        over += b.epsilon > truth
    return case | {
        "true_epsilon": truth, "theta": theta, "repeats": repeats, "refused": refused,
        "refusal_reasons": dict(reasons), "mean_epsilon": float(np.mean(eps)) if eps else None,
        "mean_mu_lower": float(np.mean(mus)) if mus else None, "above_truth": over,
        "above_truth_share": over / repeats, "seconds": time.perf_counter() - start,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    commit = git_commit() or "unknown"  # the tree that runs, read before the (long) run
    import importlib.metadata as md

    rows = []
    print(f"{'case':<32}{'m':>7}{'true eps':>10}{'theta':>7}{'refused':>8}{'mean eps':>10}"
          f"{'above':>7}")  # fmt: skip
    for case in cases():
        r = run_case(case, args.repeats, args.seed)
        rows.append(r)
        mean = "-" if r["mean_epsilon"] is None else f"{r['mean_epsilon']:.3f}"
        print(f"{r['name']:<32}{r['m']:>7}{r['true_epsilon']:>10.3f}{r['theta']:>7.3f}"
              f"{r['refused']:>8}{mean:>10}{r['above_truth']:>7}", flush=True)  # fmt: skip
    payload = {
        "config": vars(args) | {"level": LEVEL, "delta": DELTA},
        "commit": commit,
        "versions": {k: md.version(k) for k in ("numpy", "scipy", "dp-accounting")},
        "cases": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
