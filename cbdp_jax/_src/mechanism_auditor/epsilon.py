"""What a certified hockey-stick curve refutes: the curves claims allow, and the empirical epsilon.

An (epsilon, delta) claim allows at most the hockey-stick curve of the (epsilon, delta) randomized
response (:func:`rr_delta`), a mu-GDP claim the curve :func:`gdp_delta`. :func:`empirical_epsilon`
turns an audit's certified rows into the largest eps (at a delta) and the largest GDP mu they refute
(:class:`EmpiricalEpsilon`; docs/theory/auditing.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from cbdp_jax._src.mechanism_auditor import hockey_stick as hs


def rr_delta(epsilon: float, delta: float, eps: float) -> float:
    """E_{e^eps} of the (epsilon, delta) randomized response: the tight curve of an (epsilon, delta) claim.

    The pair is P = (delta, (1 - delta) e^epsilon / (1 + e^epsilon), (1 - delta) / (1 + e^epsilon), 0)
    and Q = P reversed; its hockey-stick divergence at gamma = e^eps, (1 - delta) times
    (max(0, e^epsilon - e^eps) + max(0, 1 - e^(epsilon + eps))) / (1 + e^epsilon) above delta, is
    computed with both terms divided by e^epsilon, so that a large epsilon does not overflow.
    """
    first = -math.expm1(eps - epsilon) / (1.0 + math.exp(-epsilon)) if eps < epsilon else 0.0
    second = (
        (math.exp(-epsilon) - math.exp(eps)) / (math.exp(-epsilon) + 1.0) if eps < -epsilon else 0.0
    )
    return delta + (1.0 - delta) * (first + second)


class EmpiricalEpsilon(NamedTuple):
    """What the certified hockey-stick curve refutes (the number ML auditing papers report).

    For every grid point eps_i the audit certifies (family-wise) a lower bound L_i on
    delta(eps_i) = E_{e^eps_i}(P || Q). An (eps, delta) claim implies delta(eps_i) <= delta +
    (1 - delta) max(0, e^eps - e^eps_i) / (1 + e^eps) (the randomized response's curve,
    :meth:`Claim.claimed_delta`), so it is refuted when some L_i exceeds that: solving for e^eps,
    every eps below ``epsilon = max_i log((L_i - delta + (1 - delta) e^eps_i) / (1 - L_i))`` (over i
    with L_i > delta) is refuted at the audit's level. A mu-GDP claim implies delta(eps) <= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), which
    grows with mu: every mu below ``gdp_mu`` is refuted. A row of an indicator critic 1_S with exact
    bounds P(S) >= p_lower and Q(S) <= q_upper (``AuditConfig.tail_bounds``) refutes directly every
    eps below the larger of log((p_lower - delta) / q_upper) and log((1 - delta - q_upper) /
    (1 - p_lower)) (the claim gives P(S) <= e^eps Q(S) + delta and, for the complement in the other
    direction, 1 - Q(S) <= e^eps (1 - P(S)) + delta: the randomized response's trade-off) and every
    mu below Phi^-1(p_lower) - Phi^-1(q_upper); ``epsilon`` and ``gdp_mu`` are the largest of all.

    Attributes:
      delta: The delta of the (eps, delta) claims considered (the claim's own; 0 for a pure claim).
      epsilon: The largest refuted eps (0 when none is refuted).
      gdp_mu: The largest refuted GDP mu (0 when none is).
      curve: ``(eps_i, L_i)`` of the certified curve (the best class and direction at each point).
      confidence: The family-wise level at which they are refuted.

    References:
      Nasr et al. 2023, "Tight auditing of differentially private machine learning"; Dong, Roth, Su
      2022, "Gaussian differential privacy" (the GDP trade-off curve, Corollary 2.13); Kairouz, Oh,
      Viswanath 2015, "The composition theorem for differential privacy" (Theorem 2.1).

    """

    delta: float
    epsilon: float
    gdp_mu: float
    curve: tuple[tuple[float, float], ...]
    confidence: float

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return {
            "delta": self.delta,
            "epsilon": self.epsilon,
            "gdp_mu": self.gdp_mu,
            "confidence": self.confidence,
            "curve": [{"epsilon": e, "lower_bound": b} for e, b in self.curve],
        }


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su, Cor. 2.13).

    Computed with log-CDFs so that large eps does not overflow e^eps.
    """
    from scipy.special import log_ndtr

    if mu <= 0:
        return 0.0
    a = log_ndtr(-eps / mu + mu / 2.0)
    b = eps + log_ndtr(-eps / mu - mu / 2.0)
    return float(math.exp(a) * -math.expm1(b - a)) if b < a else 0.0


def _refuted_mu(eps: float, lower: float) -> float:
    """The largest mu whose GDP delta at ``eps`` is below ``lower`` (0 if none): bisection on mu."""
    if lower <= 0.0:
        return 0.0
    if lower >= 1.0:
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) < lower:
        hi *= 2.0
        if hi > 1e3:
            return math.inf
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_delta(mid, eps) < lower else (lo, mid)
    return lo


def empirical_epsilon(rows, delta: float, confidence: float) -> EmpiricalEpsilon:
    """The largest eps (at ``delta``) and GDP mu that the certified rows refute (:class:`EmpiricalEpsilon`).

    Only rows of a hockey-stick audit (grid = epsilon) are meaningful here; every row is one member
    of the audit's Bonferroni family, so the refutations hold together at ``confidence``.
    """
    best: dict[float, float] = {}
    for r in rows:
        if math.isfinite(r.lower_bound):
            best[r.grid] = max(best.get(r.grid, -math.inf), r.lower_bound)
    curve = tuple(sorted(best.items()))
    eps_hat, mu_hat = 0.0, 0.0
    for eps_i, low in curve:
        eps_hat = max(eps_hat, refuted_epsilon(eps_i, low, delta))
        mu_hat = max(mu_hat, _refuted_mu(eps_i, low))
    for r in rows:  # a set's two exact bounds refute directly: P(S) <= e^eps Q(S) + delta
        if math.isfinite(r.p_lower) and math.isfinite(r.q_upper):
            eps_hat = max(eps_hat, hs.tail_epsilon(r.p_lower, r.q_upper, delta))
            mu_hat = max(mu_hat, _tradeoff_mu(r.p_lower, r.q_upper))
    return EmpiricalEpsilon(float(delta), eps_hat, mu_hat, curve, confidence)


def refuted_epsilon(eps_i: float, lower: float, delta: float) -> float:
    """The largest eps whose (eps, delta) claim a certified E_{e^eps_i} >= ``lower`` refutes (0 if none).

    The claim allows delta + (1 - delta) (e^eps - e^eps_i) / (1 + e^eps) at eps_i (:func:`rr_delta`),
    which grows with eps; ``lower`` exceeds it exactly when e^eps < (lower - delta + (1 - delta)
    e^eps_i) / (1 - lower). Nothing is refuted when ``lower`` does not refute even eps = 0.
    """
    if not lower > rr_delta(0.0, delta, eps_i):
        return 0.0
    if lower >= 1.0:
        return math.inf
    return max(0.0, math.log((lower - delta + (1.0 - delta) * math.exp(eps_i)) / (1.0 - lower)))


def _tradeoff_mu(p_lower: float, q_upper: float) -> float:
    """The largest GDP mu refuted by a test with power >= p_lower at size <= q_upper (0 if none).

    mu-GDP bounds every test's power by Phi(Phi^-1(size) + mu) (Dong, Roth, Su 2022, eq. (2.2)), so
    every mu below Phi^-1(p_lower) - Phi^-1(q_upper) is refuted.
    """
    from scipy.special import ndtri

    if not (0.0 < p_lower and 0.0 < q_upper < 1.0):
        return 0.0
    return max(0.0, float(ndtri(min(p_lower, 1.0)) - ndtri(q_upper)))
