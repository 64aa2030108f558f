"""A fixed-n finite-sample lower bound on a bounded mean that is nearly as tight as the CLT.

For i.i.d. Z_1..Z_n in [lo, hi] with mean mu, variance sigma^2 and third absolute central moment rho,
the Berry-Esseen inequality with Shevtsova's constant C = 0.4748 says

    sup_x | P(sqrt(n) (Zbar - mu) / sigma <= x) - Phi(x) |  <=  C rho / (sigma^3 sqrt(n)),

so P(Zbar - mu >= t sigma / sqrt(n)) <= 1 - Phi(t) + C rho / (sigma^3 sqrt(n)) for every t: a statement
about every law with three moments, at every n. sigma and rho are unknown; boundedness gives
finite-sample confidence bounds for them from the data itself:

- split the sample into disjoint pairs; W_j = (Z_{2j-1} - Z_{2j})^2 / 2 is unbiased for sigma^2 and
  lies in [0, (hi - lo)^2 / 2], V_j = |Z_{2j-1} - Z_{2j}|^3 lies in [0, (hi - lo)^3] and
  E V_j >= rho (Jensen: E_{Z'} |z - Z'|^3 >= |z - mu|^3);
- the empirical Bernstein inequality (Maurer and Pontil 2009, Theorem 4) bounds E W from both sides and
  E V from above, from the pairs' sample means and variances.

With delta split as delta_mean + delta_var_up + delta_var_low + delta_rho, take sigma_U, sigma_L, rho_U
at those levels and t with 1 - Phi(t) = delta_mean - C rho_U / (sigma_L^3 sqrt(n)). Then

    L = Zbar - t sigma_U / sqrt(n)   satisfies   P(mu < L) <= delta

(docs/theory/bounds.md, "Berry-Esseen", has the three-line proof: on the event where the moment bounds
hold, t >= t*, the quantile computed with the true moments). When the Berry-Esseen term eats the whole
budget (small n, or a heavy third moment relative to sigma^3) the bound is infeasible and says so.

Everything needed is a sum, so the bound streams: the evaluator keeps :class:`~.moments.Moments` of Z,
W and V per chunk and merges them.

References:
  Shevtsova, "On the absolute constants in the Berry-Esseen type inequalities for identically
  distributed summands", arXiv:1111.6554 (2011): C <= 0.4748.
  Maurer, Pontil, "Empirical Bernstein bounds and sample variance penalization", COLT 2009, Theorem 4.

"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.statistics import moments as mom

BERRY_ESSEEN_C = 0.4748
# How delta is spent: the mean's deviation, the variance from above and below, the third moment.
SPLIT = (0.8, 0.1, 0.05, 0.05)


class PairMoments(NamedTuple):
    """Moments of the pair statistics W = (Z_a - Z_b)^2 / 2 and V = |Z_a - Z_b|^3 (disjoint pairs)."""

    w: mom.Moments
    v: mom.Moments


def pair_moments(z: jax.Array, mask: jax.Array | None = None) -> PairMoments:
    """Pair statistics of consecutive observations (1, 2), (3, 4), ... of ``z`` ``[..., n]``.

    A pair counts only where both its members are valid (``mask``); an odd last observation is dropped.
    Traceable.
    """
    z = jnp.asarray(z)
    n = z.shape[-1] - z.shape[-1] % 2
    pair_mask = None
    if mask is not None:
        mask = jnp.broadcast_to(mask, z.shape)
        pair_mask = mask[..., 0:n:2] & mask[..., 1:n:2]
    w, v = _pair_terms(jnp, z)
    return PairMoments(mom.of(w, pair_mask), mom.of(v, pair_mask))


def _pair_terms(xp, z):
    """W = (a - b)^2 / 2 and V = |a - b|^3 of the pairs (z_1, z_2), (z_3, z_4), ... (last axis)."""
    n = z.shape[-1] - z.shape[-1] % 2
    if xp is np:  # the same operations, in place: the plan scores arrays of 2^20 terms
        d = np.subtract(z[..., 0:n:2], z[..., 1:n:2])
        np.abs(d, out=d)
        w = np.multiply(0.5, d)
        v = np.multiply(d, d)
        return np.multiply(w, d, out=w), np.multiply(v, d, out=v)
    d = xp.abs(z[..., 0:n:2] - z[..., 1:n:2])
    return 0.5 * d * d, d * d * d


def merge_pairs(a: PairMoments, b: PairMoments) -> PairMoments:
    """Pair moments of two disjoint samples."""
    return PairMoments(mom.merge(a.w, b.w), mom.merge(a.v, b.v))


def empirical_bernstein_upper(m: mom.Moments, width: float, delta: float) -> float:
    """Upper confidence bound on E W for i.i.d. W in [0, width] from its moments (Maurer-Pontil Thm 4)."""
    n = float(m.count)
    if n < 2:
        return width
    log_term = math.log(2.0 / delta)
    var = max(float(m.m2) / (n - 1.0), 0.0)
    ucb = (
        float(m.mean)
        + math.sqrt(2.0 * var * log_term / n)
        + 7.0 * width * log_term / (3.0 * (n - 1.0))
    )
    return min(ucb, width)


def empirical_bernstein_lower(m: mom.Moments, width: float, delta: float) -> float:
    """Lower confidence bound on E W for i.i.d. W in [0, width] (the upper bound of width - W)."""
    flipped = mom.Moments(m.count, width - m.mean, m.m2, width - m.hi, width - m.lo)
    return max(width - empirical_bernstein_upper(flipped, width, delta), 0.0)


class BerryEsseen(NamedTuple):
    """The Berry-Esseen bound and the quantities behind it.

    Attributes:
      lower: The lower confidence bound on the mean (``-inf`` when infeasible).
      feasible: False when the Berry-Esseen term alone exceeds the mean's share of delta.
      quantile: t, the normal quantile used.
      sigma_upper: The upper confidence bound on the standard deviation.
      sigma_lower: The lower confidence bound on the standard deviation.
      rho_upper: The upper confidence bound on the third absolute central moment.
      be_term: C rho_U / (sigma_L^3 sqrt(n)), the probability the normal approximation may be off by.

    """

    lower: float
    feasible: bool
    quantile: float
    sigma_upper: float
    sigma_lower: float
    rho_upper: float
    be_term: float


def lower_bound(
    z: mom.Moments, pairs: PairMoments, lo: float, hi: float, confidence: float
) -> BerryEsseen:
    """The finite-sample lower bound on E[Z] for i.i.d. Z in [lo, hi] (see the module docstring).

    Args:
      z: Moments of the whole sample Z_1..Z_n.
      pairs: Moments of its pair statistics (:func:`pair_moments` on the same sample).
      lo: Known lower end of Z's support.
      hi: Known upper end (> lo).
      confidence: The level 1 - delta.

    Returns:
      A :class:`BerryEsseen` record; its ``lower`` is valid for every law on [lo, hi].

    """
    delta = 1.0 - confidence
    d_mean, d_up, d_low, d_rho = (s * delta for s in SPLIT)
    # In NumPy float64, whatever the caller passed: a huge support (a KL critic near f*'s overflow)
    # then gives an infinite r**3 and a refused bound, where a Python float's ** would raise.
    r = np.float64(hi) - np.float64(lo)
    n = float(z.count)
    # There, inf - inf is the NaN refused below, not a fault to warn about.
    with np.errstate(over="ignore", invalid="ignore"):
        var_u = empirical_bernstein_upper(pairs.w, 0.5 * r * r, d_up)
        var_l = empirical_bernstein_lower(pairs.w, 0.5 * r * r, d_low)
        rho_u = empirical_bernstein_upper(pairs.v, r**3, d_rho)
    sigma_u, sigma_l = math.sqrt(var_u), math.sqrt(var_l)
    # not (> 0) also catches NaN: a support too wide for its variance bounds (inf - inf) is refused.
    if n < 2 or not sigma_l > 0:
        return BerryEsseen(-math.inf, False, math.inf, sigma_u, sigma_l, rho_u, math.inf)
    be = min(BERRY_ESSEEN_C * rho_u / (sigma_l**3 * math.sqrt(n)), 1.0)
    budget = d_mean - be
    if budget <= 0:
        return BerryEsseen(-math.inf, False, math.inf, sigma_u, sigma_l, rho_u, be)
    t = statistics.NormalDist().inv_cdf(1.0 - budget)
    return BerryEsseen(
        float(z.mean) - t * sigma_u / math.sqrt(n), True, t, sigma_u, sigma_l, rho_u, be
    )


def predicted_width(sigma: float, rho_over_sigma3: float, n: int, confidence: float) -> float:
    """The bound's distance from the mean at n with these moments, without the moments' slack.

    For choosing a method on validation data.
    """
    delta = 1.0 - confidence
    budget = SPLIT[0] * delta - BERRY_ESSEEN_C * rho_over_sigma3 / math.sqrt(max(n, 1))
    if budget <= 0 or not math.isfinite(budget):
        return math.inf
    return statistics.NormalDist().inv_cdf(1.0 - budget) * sigma / math.sqrt(n)


def moments_of_sample(z) -> tuple[mom.Moments, PairMoments]:
    """Host convenience: the moments and pair moments of a whole sample (float64 NumPy).

    :func:`pair_moments` and :func:`~.moments.of` on the host: the finite-sample plan calls this for
    each of ~30 candidate bounds B, where device programs cost 3 ms a call and NumPy 0.1 ms.
    """
    z = np.asarray(z, np.float64).ravel()
    w, v = _pair_terms(np, z)
    return mom.of_host(z), PairMoments(mom.of_host(w), mom.of_host(v))


def moments_of_rows(z) -> tuple[mom.Moments, PairMoments]:
    """:func:`moments_of_sample` of each row of ``z`` ``[K, n]`` at once: fields of shape ``[K]``.

    Row k's fields are bit for bit those of ``moments_of_sample(z[k])`` (the same reductions along a
    contiguous axis); the finite-sample plan scores all its candidate bounds B in one call.
    """
    z = np.asarray(z, np.float64)
    w, v = _pair_terms(np, z)
    return mom.of_host(z, axis=-1), PairMoments(mom.of_host(w, axis=-1), mom.of_host(v, axis=-1))
