"""How high can a one-run bound valid for EVERY (eps, delta)-DP mechanism go on mu-GDP Gaussian scores?

The argument (docs/theory/one_run.md, section 3b). Take the truth: m canaries, each in with
probability 1/2, canary i's score N(mu, 1) if in and N(0, 1) if out, independently. For a target
eps build a null that is (eps, 0)-DP with respect to each canary and differs from the truth only in
far tails: per canary replace the out-law q by q' = max(q, e^-eps p) on {y > mu / 2} (and the in-law
p by max(p, e^-eps q) on {y < mu / 2}), taking the added mass back proportionally from the other side.
Then p' <= e^eps q' and q' <= e^eps p' everywhere, and each law moves by e^-eps delta_mu(eps) in total
variation, where delta_mu is the GDP curve's delta. A per-canary maximal coupling makes the m-canary
observations of truth and null differ with probability at most tv(eps) = 1 - (1 - e^-eps
delta_mu(eps))^m. A method valid at level 1 - beta reports more than eps under the null with
probability <= beta, so under the truth with probability <= beta + tv(eps): no such method's median
bound exceeds the eps where beta + tv(eps) = 1/2.

The construction is checked numerically on a grid (the hockey-stick divergence of the null pair at
eps is 0 in both directions, and the total variation matches e^-eps delta_mu(eps)).

  python benchmarks/measured/one-run/exploration/finite_sample_ceiling.py
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from cbdp_jax import one_run
from cbdp_jax.audit import gdp_delta

BETA = 0.05


def tv_per_canary(mu: float, eps: float) -> float:
    return math.exp(-eps) * gdp_delta(mu, eps)


def power_cap(mu: float, m: int, eps: float) -> float:
    """Largest probability with which a level-0.95 method valid for all eps-DP runs reports >= eps."""
    return min(1.0, BETA + 1.0 - (1.0 - tv_per_canary(mu, eps)) ** m)


def median_ceiling(mu: float, m: int) -> float:
    return optimize.brentq(lambda e: power_cap(mu, m, e) - 0.5, 0.01, 60.0)


def check_construction(mu: float, eps: float) -> tuple[float, float, float]:
    """(hockey-stick of the null pair in its worse direction, its tv from the truth, e^-eps delta)."""
    y = np.linspace(-40.0, 40.0, 1_600_001)
    p, q = stats.norm.pdf(y, mu), stats.norm.pdf(y, 0.0)
    up = y > mu / 2
    q2, p2 = (
        np.where(up, np.maximum(q, math.exp(-eps) * p), q),
        np.where(~up, np.maximum(p, math.exp(-eps) * q), p),
    )
    add_q = np.trapezoid(q2 - q, y)
    add_p = np.trapezoid(p2 - p, y)
    q2 = np.where(up, q2, q2 * (1 - add_q / np.trapezoid(np.where(up, 0, q), y)))
    p2 = np.where(~up, p2, p2 * (1 - add_p / np.trapezoid(np.where(~up, 0, p), y)))
    hs = max(
        np.trapezoid(np.maximum(p2 - math.exp(eps) * q2, 0), y),
        np.trapezoid(np.maximum(q2 - math.exp(eps) * p2, 0), y),
    )
    return float(hs), float(0.5 * np.trapezoid(np.abs(q2 - q), y)), tv_per_canary(mu, eps)


def main() -> None:
    print("construction check (mu, eps): hockey-stick of the null, tv(q, q'), e^-eps delta_mu(eps)")
    for mu, eps in ((2.0, 6.2), (1.0, 3.0)):
        print(f"  {mu}, {eps}: " + ", ".join(f"{v:.3g}" for v in check_construction(mu, eps)))
    print(f"{'mu':>4}{'m':>7}{'true eps':>10}{'median ceiling':>16}{'P[>= 6.2] cap':>15}")
    for mu in (1.0, 2.0, 4.0):
        for m in (1000, 10_000):
            print(f"{mu:>4g}{m:>7}{one_run.gdp_epsilon(mu, 1e-5):>10.3f}"
                  f"{median_ceiling(mu, m):>16.3f}{power_cap(mu, m, 6.2):>15.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
