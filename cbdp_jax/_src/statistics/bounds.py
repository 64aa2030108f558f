"""The lower confidence bounds the library reports, and what each one guarantees.

Every bound here is a one-sided lower confidence bound on the mean of the f-form terms of ONE fixed
critic h, evaluated on samples it was neither trained nor selected on: v(h) = E_P[h] - E_Q[f*(h)]. Since
v(h) <= D^H(P, Q) <= D(P, Q) whenever h is in H, the same number is a lower bound on the restricted and
on the unrestricted divergence. A :class:`Bound` says which kind of guarantee it carries:

- ``'exact'``: a value computed from the known laws (quadrature), not from samples;
- ``'finite-sample'``: valid for every n and every pair of laws at the stated confidence, assuming only
  that the f-form terms are bounded (a bounded critic) and the samples independent: the Berry-Esseen
  bound (:mod:`.berry_esseen`, fixed n) or the betting bound (:mod:`.betting`, fixed n or anytime);
- ``'asymptotic'``: the CLT bound  estimate - z * SE, valid as n -> inf when both terms have finite
  variance; the estimator checks the tails first (:mod:`.tails`) and refuses when they look infinite.

Family-wise statements (several directions, orders or classes certified at once) split delta evenly
(Bonferroni): each bound is taken at level 1 - delta / K, so all K hold together with probability
>= 1 - delta. The Renyi divergence is a monotone map of the alpha-divergence (paper eq. (3)), so a lower
bound maps to a lower bound; the map is concave, so the bound must be taken on the f-scale first and
mapped afterwards (mapping estimate - z * SE computed on the Renyi scale would be larger and wrong).

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019, eq. (3).
  docs/theory/bounds.md.

"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cbdp_jax._src.infra.validation import check_choice, check_in_range, check_int_at_least
from cbdp_jax._src.statistics import berry_esseen, betting
from cbdp_jax._src.statistics import moments as mom

GUARANTEES = ("exact", "finite-sample", "asymptotic")
FINITE_SAMPLE_METHODS = ("auto", "berry-esseen", "betting")


class Bound(NamedTuple):
    """A one-sided lower confidence bound on v(h), on the f-divergence scale.

    Attributes:
      value: The bound (``-inf`` when nothing is certified).
      kind: ``'exact'``, ``'finite-sample'`` or ``'asymptotic'`` (see the module docstring).
      method: ``'exact'``, ``'clt'``, ``'berry-esseen'``, ``'betting'`` or ``'betting-sequence'``.
      confidence: The level of this one bound (after the family-wise split).
      family_size: How many bounds share the overall level (Bonferroni).
      certified: False when the bound was refused (its assumption visibly fails, or it is infeasible);
        ``value`` is then ``-inf`` and ``reason`` says why.
      reason: Why the bound was refused, or None.

    """

    value: float
    kind: str
    method: str
    confidence: float
    family_size: int = 1
    certified: bool = True
    reason: str | None = None

    def refused(self, reason: str) -> Bound:
        """The same bound, refused for ``reason``."""
        return self._replace(value=-math.inf, certified=False, reason=reason)


def family_confidence(confidence: float, family_size: int = 1) -> float:
    """The level of each of ``family_size`` bounds so that all hold together at ``confidence``."""
    check_in_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    k = check_int_at_least("family_size", family_size, 1)
    return 1.0 - (1.0 - confidence) / k


def z_quantile(confidence: float) -> float:
    """The standard normal quantile z with P(N(0, 1) <= z) = confidence."""
    return statistics.NormalDist().inv_cdf(confidence)


def clt_lower_bound(
    p: mom.Moments, q: mom.Moments, *, confidence: float, family_size: int = 1
) -> Bound:
    """The asymptotic bound mean(h(X)) - mean(f*(h(Y))) - z * SE from the two terms' moments."""
    level = family_confidence(confidence, family_size)
    est = float(p.mean) - float(q.mean)
    se = math.sqrt(float(p.variance) / float(p.count) + float(q.variance) / float(q.count))
    value = est - z_quantile(level) * se if math.isfinite(est) and math.isfinite(se) else -math.inf
    return Bound(value, "asymptotic", "clt", level, family_size)


def choose_finite_sample_method(
    sigma: float, rho_over_sigma3: float, n: int, confidence: float
) -> str:
    """``'berry-esseen'`` or ``'betting'``: whichever is predicted narrower at n with these moments.

    Call it with moments of VALIDATION data (never the test sample whose bound is chosen), so that the
    choice does not depend on the data the bound is computed from.
    """
    be = berry_esseen.predicted_width(sigma, rho_over_sigma3, n, confidence)
    bet = sigma * math.sqrt(2.0 * math.log(1.0 / (1.0 - confidence)) / max(n, 1))
    return "berry-esseen" if be < bet else "betting"


def finite_sample_lower_bound(
    *,
    lo: float,
    hi: float,
    confidence: float,
    method: str,
    z: mom.Moments | None = None,
    pairs: berry_esseen.PairMoments | None = None,
    samples: np.ndarray | None = None,
    family_size: int = 1,
) -> Bound:
    """The finite-sample bound on E[Z] for i.i.d. Z in [lo, hi] by ``method``.

    Args:
      lo: Known lower end of Z's support.
      hi: Known upper end.
      confidence: The overall level; each of ``family_size`` bounds gets 1 - delta / family_size.
      method: ``'berry-esseen'`` (needs ``z`` and ``pairs``) or ``'betting'`` (needs ``samples``, in
        the order drawn). Choose it before looking at the data (:func:`choose_finite_sample_method`).
      z: Moments of the sample.
      pairs: Its pair moments (:func:`.berry_esseen.pair_moments`).
      samples: The sample itself.
      family_size: Bonferroni family size.

    Returns:
      A :class:`Bound` of kind ``'finite-sample'`` (refused, with the reason, when infeasible).

    """
    check_choice("method", method, FINITE_SAMPLE_METHODS[1:])
    level = family_confidence(confidence, family_size)
    if method == "betting":
        if samples is None:
            raise ValueError("the betting bound needs the samples")
        value = betting.lower_bound(samples, lo, hi, level)
        return Bound(value, "finite-sample", "betting", level, family_size)
    if z is None or pairs is None:
        raise ValueError("the Berry-Esseen bound needs the moments and the pair moments")
    be = berry_esseen.lower_bound(z, pairs, lo, hi, level)
    bound = Bound(be.lower, "finite-sample", "berry-esseen", level, family_size)
    if not be.feasible:
        return bound.refused(
            f"the Berry-Esseen term {be.be_term:.3g} exceeds the budget at n = {int(z.count)}: "
            "too few samples for this critic's range"
        )
    return bound


def renyi_from_f(value: float, alpha: float) -> float:
    """D_R = log(1 + alpha (alpha - 1) v) / (alpha - 1) (paper eq. (3)); -inf below the domain."""
    if value == math.inf:
        return math.inf
    arg = 1.0 + alpha * (alpha - 1.0) * value
    if not arg > 0:
        return -math.inf
    return math.log(arg) / (alpha - 1.0)


def f_from_renyi(value: float, alpha: float) -> float:
    """The inverse of :func:`renyi_from_f`."""
    return math.expm1((alpha - 1.0) * value) / (alpha * (alpha - 1.0))


def certifiable_max(
    conjugate: Callable[[np.ndarray], np.ndarray], n: int, confidence: float
) -> float:
    """The largest f-scale lower bound ANY n paired samples can certify with a bounded critic.

    For a critic bounded by B the paired terms lie in [lo_B, hi_B] = [-B - max f*, B - min f*] over
    [-B, B]; the best possible data (every term at hi_B) gives the betting bound
    hi_B - (hi_B - lo_B)(1 - u_n), u_n the unit-scale bound of n ones. Maximised over B. Since
    max f* grows fast (exp for KL), the maximum grows like log n: this is why a divergence far above
    log n can never be certified from n samples, and why two samples with disjoint supports get a
    finite bound, never +inf.
    """
    n = max(int(n), 1)
    log_inv = math.log(1.0 / (1.0 - confidence))
    c = betting.TRUNCATION
    # All-ones data: each factor is 1 + (c / m)(1 - m), so m is rejected iff n log(1 + c (1 - m) / m)
    # >= log(1/delta); solved for the largest such m.
    growth = math.expm1(log_inv / n)
    unit = c / (c + growth)

    def best_on(grid: np.ndarray) -> tuple[float, int]:
        b = grid[:, None]
        s = b * np.linspace(-1.0, 1.0, 201)[None, :]  # f* for every B at once
        with np.errstate(over="ignore", invalid="ignore"):
            f = np.asarray(conjugate(s), np.float64)
        ok = np.all(np.isfinite(f), axis=1)
        lo, hi = -grid - f.max(axis=1), grid - f.min(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            values = np.where(ok, hi - (hi - lo) * (1.0 - unit), -np.inf)
        j = int(np.argmax(values))
        return float(values[j]), j

    # The best B grows like n^(alpha - 1) for the alpha family: extend the grid upwards while the
    # best point is its last one, then refine around the best point.
    top = 1e6
    while True:
        grid = np.geomspace(1e-3, top, 400)
        value, j = best_on(grid)
        if j < grid.size - 1 or top >= 1e290:
            break
        top *= 1e6
    fine = np.geomspace(grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)], 400)
    return max(value, best_on(fine)[0])


def to_reported(div, value: float) -> float:
    """Maps an f-scale value to the divergence's reported scale (the Renyi map for ``'renyi'``).

    Infinities pass through; a value below the Renyi map's domain becomes ``-inf``.
    """
    value = float(value)
    if math.isinf(value) or math.isnan(value):
        return value
    if div.name == "renyi":
        return renyi_from_f(value, div.alpha)
    return float(div.to_reported(value))


def renyi_slope(div, f_value: float) -> float:
    """d(reported) / d(f-value) at ``f_value``: the delta-method factor of the Renyi map (else 1)."""
    if div.name != "renyi":
        return 1.0
    a = div.alpha
    denom = 1.0 + a * (a - 1.0) * f_value
    return a / denom if denom > 0 else math.inf
