"""Exact binomial (Clopper-Pearson) bounds for indicator critics, and the tail set of an audit.

The soundness checks compare certified bounds with closed forms: P(S) - gamma Q(S) of interval
cells S under a Gaussian and a Laplace pair, and the Gaussian mechanism's exact eps(delta). Each
statistical check runs at a raised level (so a wrong bound would fail often) over repeats, with a
negative control (the same bounds without the Bonferroni correction) that the check catches.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from scipy import stats

from cbdp_jax._src.mechanism_auditor import certify as audit_certify
from cbdp_jax._src.mechanism_auditor import claims as audit_claims
from cbdp_jax._src.mechanism_auditor import config as audit_config
from cbdp_jax._src.mechanism_auditor import epsilon as audit_epsilon
from cbdp_jax._src.mechanism_auditor import hockey_stick as hs
from cbdp_jax._src.statistics import binomial


def test_clopper_pearson_inverts_the_binomial_tail_exactly():
    # L(k) is the p at which P(Bin(n, p) >= k) = a, U(k) the p at which P(Bin(n, p) <= k) = a
    n, conf = 1000, 0.975
    k = np.array([1, 3, 50, 500, 999])
    low = binomial.clopper_pearson_lower(k, n, conf)
    up = binomial.clopper_pearson_upper(k, n, conf)
    np.testing.assert_allclose(stats.binom.sf(k - 1, n, low), 1 - conf, rtol=1e-8)
    np.testing.assert_allclose(stats.binom.cdf(k, n, up), 1 - conf, rtol=1e-8)
    assert binomial.clopper_pearson_lower(0, n, conf) == 0.0
    assert binomial.clopper_pearson_upper(n, n, conf) == 1.0
    # no success in n: the upper bound is 1 - a^(1/n), about log(1/a) / n (the tail regime)
    assert binomial.clopper_pearson_upper(0, n, conf) == pytest.approx(1 - 0.025 ** (1 / n))
    with pytest.raises(ValueError, match="k is invalid"):
        binomial.clopper_pearson_lower(5, 4, conf)
    with pytest.raises(ValueError, match="confidence"):
        binomial.clopper_pearson_upper(1, 4, 1.0)


def _cells(law: str):
    """Interval cells [e_k, e_k+1) and their exact P and Q masses (P shifted by 1 from Q)."""
    edges = np.linspace(-1.5, 3.0, 21)
    cdf = stats.norm.cdf if law == "gauss" else stats.laplace.cdf
    p, q = np.diff(cdf(edges - 1.0)), np.diff(cdf(edges))
    draw = (
        (lambda r, n, m: r.normal(m, 1.0, n))
        if law == "gauss"
        else (lambda r, n, m: r.laplace(m, 1.0, n))
    )
    return edges, p, q, draw


def _familywise_misses(law: str, family_size: int, repeats: int = 100, n: int = 4000) -> int:
    """Repeats in which SOME cell's certified P_lo - gamma Q_up exceeds its true P(S) - gamma Q(S)."""
    edges, p, q, draw = _cells(law)
    gamma, rng, misses = math.exp(0.5), np.random.default_rng(7), 0
    truth = p - gamma * q
    for _ in range(repeats):
        kp = np.histogram(draw(rng, n, 1.0), edges)[0]
        kq = np.histogram(draw(rng, n, 0.0), edges)[0]
        bounds = [
            hs.certify_indicator(
                np.arange(n) < a, np.arange(n) < b, gamma, confidence=0.8,
                family_size=family_size, betting_too=False,
            ).bound.value
            for a, b in zip(kp, kq, strict=True)
        ]  # fmt: skip
        misses += bool(np.any(np.array(bounds) > truth))
    return misses


@pytest.mark.parametrize("law", ["gauss", "laplace"])
def test_indicator_bounds_hold_family_wise_and_fail_without_bonferroni(law):
    # 20 cells, family-wise level 0.8: a miss (any bound above its cell's exact value) has
    # probability <= 0.2 per repeat, so over 100 repeats more than the binomial's 1 - 1e-4 quantile
    # (37) misses would mean an unsound bound. Negative control: each cell certified at 0.8 alone
    # (no Bonferroni) misses in most repeats, so the same check fails it.
    limit = stats.binom.ppf(1 - 1e-4, 100, 0.2)
    assert _familywise_misses(law, family_size=20) <= limit
    assert _familywise_misses(law, family_size=1) > limit


def test_certify_indicator_is_the_better_of_two_bounds_and_reports_both_rates():
    rng = np.random.default_rng(3)
    hp = (rng.normal(1.0, 1.0, 20_000) > 3.5).astype(float)
    hq = (rng.normal(0.0, 1.0, 20_000) > 3.5).astype(float)
    gamma = math.exp(2.0)
    both = hs.certify_indicator(hp, hq, gamma, confidence=0.95, family_size=4)
    alone = hs.certify_indicator(hp, hq, gamma, confidence=0.95, family_size=4, betting_too=False)
    betting = hs.certify(hp, hq, gamma, confidence=0.95, family_size=4)
    # the exact rates at half the error each (without betting) are narrower than at a quarter
    assert alone.p_lower > both.p_lower and alone.q_upper < both.q_upper
    assert both.bound.value == pytest.approx(
        max(both.p_lower - gamma * both.q_upper, hs.certify(hp, hq, gamma, confidence=1 - 0.05 / 8)
            .bound.value)
    )  # fmt: skip
    # in the tail (P(S) = 0.0062, Q(S) = 0.00023) the two exact rates refute eps at delta = 1e-5
    # directly (log(P_lo / Q_up) ~ 2.3), beyond what a bound on P(S) - e^2 Q(S) alone refutes there
    # (log(e^2 + L - delta) ~ 2.0, whichever bound gives L)
    via_ratio = hs.tail_epsilon(alone.p_lower, alone.q_upper, 1e-5)
    assert via_ratio > math.log(gamma + max(alone.bound.value, betting.bound.value)) + 0.2
    assert alone.p_lower <= stats.norm.sf(2.5) and alone.q_upper >= stats.norm.sf(3.5)


def test_tail_epsilon_and_tradeoff_mu_refute_what_the_set_shows():
    # P(S) >= 0.02, Q(S) <= 0.001: (eps, 1e-5)-DP needs e^eps >= (0.02 - 1e-5) / 0.001
    assert hs.tail_epsilon(0.02, 0.001, 1e-5) == pytest.approx(math.log(19.99))
    assert hs.tail_epsilon(1e-6, 1e-9, 1e-5) == 0.0
    assert audit_epsilon._tradeoff_mu(0.5, stats.norm.sf(1.0)) == pytest.approx(1.0)
    assert audit_epsilon._tradeoff_mu(0.0, 0.1) == 0.0


def _gaussian_audit(seed: int, n: int, mu: float, confidence: float):
    claim = audit_claims.parse_claim("approx:4:1e-5")
    config = audit_config.AuditConfig(
        samples=n, classes=("halfspace", "histogram"), eps_grid=(0.25, 0.5, 1.0),
        confidence=confidence, tail_bounds=True,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    xp, xq = rng.normal(mu, 1.0, (n, 1)), rng.normal(0.0, 1.0, (n, 1))
    rows, family = audit_certify._hockey_rows(jax.random.key(seed), xp, xq, claim, config)
    return rows, family, audit_epsilon.empirical_epsilon(rows, claim.delta, confidence)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    from scipy.optimize import brentq

    return brentq(lambda e: audit_epsilon.gdp_delta(mu, e) - delta, 0.0, 50.0)


def test_tail_rows_certify_eps_at_small_delta_below_the_exact_value():
    # mu = 0.925: the Gaussian mechanism with eps(1e-5) = 4.0. With 2 x 10^4 samples per side the
    # range-only bound refutes nothing near delta = 1e-5 beyond eps ~ 1; the tail set does better,
    # and never more than the exact 4.0 (the family-wise guarantee; repeats in the slow test).
    rows, family, emp = _gaussian_audit(0, 20_000, 0.925, 0.95)
    assert family == 3 * 2 * 2 + 2
    assert [r.critic for r in rows[-2:]] == ["tail-halfspace", "tail-halfspace"]
    exact = _gaussian_epsilon(0.925, 1e-5)
    assert 1.3 < emp.epsilon < exact
    assert 0.5 < emp.gdp_mu < 0.925


@pytest.mark.slow
def test_fifty_tail_audits_never_certify_above_the_exact_epsilon():
    # at a raised level (confidence 0.5), 50 audits of the Gaussian mechanism. The family-wise
    # guarantee allows some bound to be wrong in at most half of them, so the refuted GDP mu, which
    # is tight here (the Gaussian's trade-off curve IS the mu-GDP curve, so a wrong bound can push it
    # past 0.925), may exceed 0.925 in at most 36 of 50 (the binomial's 0.999 quantile; 1 of 50
    # observed, from a histogram row's curve bound). The refuted eps at delta = 1e-5 is far from
    # tight at 2 x 10^4 samples (about 2.3 against 4.0): it must never reach the exact value.
    exact = _gaussian_epsilon(0.925, 1e-5)
    eps_over = mu_over = 0
    for seed in range(50):
        _, _, emp = _gaussian_audit(100 + seed, 20_000, 0.925, 0.5)
        eps_over += emp.epsilon >= exact
        mu_over += emp.gdp_mu >= 0.925
    assert eps_over == 0
    assert mu_over <= stats.binom.ppf(0.999, 50, 0.5)
