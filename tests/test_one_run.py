"""One-run auditing: the bounds against independent computations, soundness over repeats, power,
a negative control for the soundness check, and input errors.

Soundness is checked on randomized response with delta = 0, where the Steinke bound is tight (every
guess is right with probability exactly e^eps / (1 + e^eps)), so an unsound bound would show: over N
repeats a bound at level 1 - beta exceeds the true eps in Binomial(N, <= beta) of them, and the test
allows the 99.9% quantile of Binomial(N, beta). A correct implementation fails it with probability
< 0.1%; the seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from cbdp_jax import InvalidParameterError
from cbdp_jax import one_run as orun
from cbdp_jax.audit import gdp_delta

N_REPEATS = 100
BETA = 0.05
ALLOWED = int(stats.binom.ppf(0.999, N_REPEATS, BETA))  # 13 of 100


def _mp_p_value(m, r, v, eps, delta):
    """Steinke et al.'s bound written out from binomial probabilities in 50-digit arithmetic."""
    mpmath.mp.dps = 50
    q = mpmath.e**eps / (1 + mpmath.e**eps)
    pmf = [mpmath.binomial(r, j) * q**j * (1 - q) ** (r - j) for j in range(r + 1)]
    tail = mpmath.fsum(pmf[v:])  # P[X >= v]
    gaps, below = [], mpmath.mpf(0)
    for i in range(1, v + 1):
        below += pmf[v - i]  # P[v - i <= X < v] = P[X >= v - i] - P[X >= v]
        gaps.append(below / i)
    return float(min(tail + 2 * m * mpmath.mpf(delta) * max(gaps), 1))


@pytest.mark.parametrize(
    "m, r, v, eps, delta",
    [(1000, 100, 70, 0.5, 0.0), (1000, 100, 70, 0.5, 1e-5), (200, 40, 35, 1.0, 1e-4),
     (5000, 300, 240, 1.2, 1e-6), (50, 10, 10, 2.0, 1e-3)],
)  # fmt: skip
def test_steinke_p_value_matches_term_by_term_high_precision(m, r, v, eps, delta):
    assert orun.steinke_p_value(m, r, v, eps, delta) == pytest.approx(
        _mp_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15
    )


@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_steinke_epsilon_is_where_the_p_value_crosses_beta(delta):
    m, r, v = 1000, 200, 150
    eps = orun.steinke_epsilon(m, r, v, delta=delta, beta=BETA)
    assert _mp_p_value(m, r, v, eps, delta) <= BETA
    assert _mp_p_value(m, r, v, eps * 1.001 + 1e-3, delta) > BETA


def _scalar_refutes(m, k, c, tau, rate):
    """The f-DP recursion written out one step at a time (independent of the vectorised version)."""
    correct, wrong = tau * c / m, tau * (k - c) / m
    for i in range(c - 1, -1, -1):
        need = max(wrong, float(rate(correct)))
        if need == wrong:
            break
        correct = min(correct + i / (k - i) * (need - wrong), 1.0)
        wrong = need
    return correct + wrong > k / m


@pytest.mark.parametrize("eps", [0.3, 0.8, 1.5, 3.0])
def test_fdp_refutes_matches_a_scalar_recursion(eps):
    ks, cs = np.array([50, 100, 200, 200, 400]), np.array([45, 80, 150, 190, 260])
    got = orun.fdp_refutes(1000, ks, cs, 0.01, lambda r: orun.dp_false_rate(r, eps, 1e-5))
    want = [_scalar_refutes(1000, k, c, 0.01, lambda r: orun.dp_false_rate(r, eps, 1e-5))
            for k, c in zip(ks, cs, strict=True)]  # fmt: skip
    assert got.tolist() == want
    assert 0 < sum(want) < len(want) or eps in (0.3, 3.0)


def test_false_rates_invert_the_trade_off_curves():
    a = np.linspace(0.0, 1.0, 200_001)
    eps, delta, mu = 1.0, 0.01, 1.5
    f_dp = np.maximum(
        0, np.maximum(1 - delta - math.exp(eps) * a, math.exp(-eps) * (1 - delta - a))
    )
    f_gdp = stats.norm.cdf(stats.norm.ppf(1 - a) - mu)
    for r in (0.1, 0.4, 0.8, 0.99):
        assert orun.dp_false_rate(np.array(r), eps, delta) == pytest.approx(
            a[np.argmax(f_dp <= 1 - r)], abs=1e-5
        )
        assert orun.gdp_false_rate(np.array(r), mu) == pytest.approx(
            a[np.argmax(f_gdp <= 1 - r)], abs=1e-5
        )


@pytest.mark.parametrize("mu, delta", [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-6)])
def test_gdp_epsilon_inverts_gdp_delta(mu, delta):
    assert gdp_delta(mu, orun.gdp_epsilon(mu, delta)) == pytest.approx(delta, rel=1e-6)


def test_gdp_epsilon_at_delta_zero_is_infinite():
    assert orun.gdp_epsilon(1.0, 0.0) == math.inf and orun.gdp_epsilon(0.0, 0.0) == 0.0


def test_count_correct_matches_a_direct_count():
    rng = np.random.default_rng(0)
    scores, inc = rng.normal(size=50), rng.random(50) < 0.5
    order = np.argsort(-scores)
    choices = [(10, 0), (0, 7), (20, 30), (25, 25)]
    fixed, k_plus = orun.count_correct(scores, inc, choices, centered=False)
    for (kp, km), got, got_kp in zip(choices, fixed, k_plus, strict=True):
        assert got == inc[order[:kp]].sum() + (~inc[order[50 - km :]]).sum() and got_kp == kp
    centered, k_plus = orun.count_correct(scores, inc, choices)
    d = scores - scores.mean()
    far = np.argsort(-np.abs(d))
    for (kp, km), got, got_kp in zip(choices, centered, k_plus, strict=True):
        if kp and km:
            pick = far[: kp + km]
            assert got == np.sum((d[pick] >= 0) == inc[pick]) and got_kp == np.sum(d[pick] >= 0)


def test_centered_guesses_follow_tied_scores():
    """Binary scores: the two-sided choice of all m guesses says "in" exactly where the score is 1."""
    inc = np.array([1, 1, 0, 0, 1, 0, 1], bool)
    scores = np.array([1, 0, 0, 0, 1, 1, 1], float)
    correct, k_plus = orun.count_correct(scores, inc, [(4, 3)])
    assert k_plus[0] == 4 and correct[0] == 5


def _rr(rng, eps: float, m: int):
    """Randomized response on each canary's bit: eps-DP, the Steinke bound's tight case."""
    inc = rng.random(m) < 0.5
    keep = rng.random(m) < 1.0 / (1.0 + math.exp(-eps))
    return np.where(keep, inc, ~inc).astype(float), inc


def test_bounds_exceed_the_true_epsilon_at_most_as_often_as_beta_allows():
    rng, eps, m = np.random.default_rng(11), 1.0, 1000
    over = {"steinke-fixed": 0, "fdp-family": 0}
    for _ in range(N_REPEATS):
        s, inc = _rr(rng, eps, m)
        fixed = orun.one_run_audit(s, inc, delta=0.0, method="steinke", choices=[(200, 200)])
        family = orun.one_run_audit(s, inc, delta=0.0, method="fdp")
        over["steinke-fixed"] += fixed.epsilon > eps
        over["fdp-family"] += family.epsilon > eps
    print("exceedances of", N_REPEATS, over, "allowed", ALLOWED)
    assert max(over.values()) <= ALLOWED, over


def test_gdp_mu_bound_is_sound_on_gaussian_scores():
    # scores N(mu, 1) if included, N(0, 1) if not: each canary's score is a mu-GDP release
    rng, mu, m = np.random.default_rng(12), 1.0, 1000
    over = 0
    for _ in range(N_REPEATS):
        inc = rng.random(m) < 0.5
        b = orun.one_run_audit(rng.normal(size=m) + mu * inc, inc, method="gdp", choices=[(60, 60)])
        over += b.gdp_mu > mu
    print("gdp_mu exceedances of", N_REPEATS, over, "allowed", ALLOWED)
    assert over <= ALLOWED


def test_family_weights_give_half_of_beta_to_guessing_on_every_canary():
    choices = orun.guess_candidates(1000)
    w = orun.family_weights(choices, 1000)
    assert sum(choices[0]) == 1000 and w[0] == 0.5
    np.testing.assert_allclose(w[1:], 0.5 / (len(choices) - 1))
    assert math.isclose(w.sum(), 1.0)
    np.testing.assert_array_equal(orun.family_weights([(4, 4)], 1000), [1.0])
    np.testing.assert_allclose(orun.family_weights([(4, 4), (2, 2)], 1000), [0.5, 0.5])
    # explicit weights are normalised: [2, 2] is the equal split, the same bound as the default there
    rng = np.random.default_rng(5)
    inc = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 2.0 * inc
    few = [(500, 500), (50, 50)]
    a = orun.one_run_audit(scores, inc, method="fdp", choices=few, weights=[2.0, 2.0])
    b = orun.one_run_audit(scores, inc, method="fdp", choices=few)
    assert a.epsilon == b.epsilon


def test_strongly_non_private_run_gives_a_clearly_positive_bound():
    rng, m = np.random.default_rng(3), 1000
    inc = rng.random(m) < 0.5
    scores = rng.normal(size=m) + 4.0 * inc
    for method in orun.METHODS:
        b = orun.one_run_audit(scores, inc, delta=1e-5, method=method)
        assert b.epsilon > 2.0, b
        guesses = method != "gaussian-scores"
        assert b.correct <= b.k_plus + b.k_minus and b.family_size == (7 if guesses else 0)


def test_gdp_reports_mu_and_fills_epsilon_only_with_the_fdp_bound():
    """'gdp': epsilon is the f_{eps,delta} refutation on the same guesses ('fdp'); the GDP-convention
    number (mu's eps at delta) sits in epsilon_gaussian_curve, and the guarantee says so."""
    rng, m, delta = np.random.default_rng(4), 1000, 1e-5
    inc = rng.random(m) < 0.5
    scores = rng.normal(size=m) + 2.0 * inc
    gdp = orun.one_run_audit(scores, inc, delta=delta, method="gdp")
    fdp = orun.one_run_audit(scores, inc, delta=delta, method="fdp")
    assert gdp.epsilon == fdp.epsilon and (gdp.k_plus, gdp.correct) == (fdp.k_plus, fdp.correct)
    assert gdp.gdp_mu > 1.0
    assert gdp.epsilon_gaussian_curve == orun.gdp_epsilon(gdp.gdp_mu, delta) > gdp.epsilon
    assert "exactly Gaussian" in gdp.guarantee
    assert math.isnan(fdp.epsilon_gaussian_curve) and math.isnan(fdp.gdp_mu)


# Randomized response eps = 1, m = 1,000, delta = 1e-5: the (eps, delta) claim (1, 1e-5) is true, so
# a reported epsilon above 1 is a false refutation. At level 0.95 each method's count of such runs in
# 200 is at most Binomial(200, 0.05) (stochastically); P[Binomial(200, 0.05) > 21] = 4.8e-4, so
# allowing 21 fails a sound method with probability < 0.05% (the seed is fixed: deterministic).
RR_REPEATS = 200
RR_ALLOWED = 21
assert stats.binom.sf(RR_ALLOWED, RR_REPEATS, BETA) < 5e-4


@pytest.fixture(scope="module")
def rr_exceedances() -> dict[str, int]:
    """Runs (of 200) with epsilon above 1, per method, and the GDP-convention number's count."""
    rng = np.random.default_rng(2024)
    over = dict.fromkeys((*orun.METHODS, "gdp epsilon_gaussian_curve"), 0)
    for _ in range(RR_REPEATS):
        s, inc = _rr(rng, 1.0, 1000)
        for method in ("steinke", "fdp", "gdp"):
            b = orun.one_run_audit(s, inc, delta=1e-5, method=method)
            over[method] += b.epsilon > 1.0
            if method == "gdp":
                over["gdp epsilon_gaussian_curve"] += b.epsilon_gaussian_curve > 1.0
        with pytest.raises(InvalidParameterError, match="^scores takes 2 distinct values"):
            orun.one_run_audit(s, inc, delta=1e-5, method="gaussian-scores")
    print("randomized response eps = 1: runs of", RR_REPEATS, "above 1:", over)
    return over


def test_every_method_is_sound_on_randomized_response(rr_exceedances):
    """Measured (seed 2024): steinke 6, fdp 5, gdp 5 of 200; 'gaussian-scores' refuses all 200."""
    for method in ("steinke", "fdp", "gdp"):
        assert rr_exceedances[method] <= RR_ALLOWED, rr_exceedances
    assert rr_exceedances["gaussian-scores"] == 0


def test_randomized_response_check_catches_the_gaussian_curve_number(rr_exceedances):
    """Negative control: the GDP-convention number (what 'gdp' used to report as epsilon, and what
    jax_privacy's f-DP one-run reports) is above 1 in nearly every run (200 of 200 measured)."""
    assert rr_exceedances["gdp epsilon_gaussian_curve"] > RR_ALLOWED


def test_soundness_check_catches_a_bound_without_the_union_correction():
    """Negative control: the maximum over 28 choices, each at beta (no Bonferroni), is unsound."""
    rng, eps, m = np.random.default_rng(11), 1.0, 1000
    choices = orun.guess_candidates(m, ratio=math.sqrt(2.0), one_sided=True)
    assert len(choices) == 28
    guesses = np.array([kp + km for kp, km in choices])
    over = 0
    for _ in range(N_REPEATS):
        s, inc = _rr(rng, eps, m)
        correct = orun.count_correct(s, inc, choices)[0]
        over += orun.fdp_epsilon(m, guesses, correct, delta=0.0, beta=BETA)[0] > eps
    print("uncorrected exceedances of", N_REPEATS, over, "allowed", ALLOWED)
    assert over > ALLOWED, over


@pytest.mark.parametrize(
    "kwargs, name",
    [({"scores": np.zeros((3, 2))}, "scores"), ({"scores": [1.0, np.nan, 0.0]}, "scores"),
     ({"included": [1, 0]}, "included"), ({"included": [2, 0, 1]}, "included"),
     ({"delta": 1.0}, "delta"), ({"delta": -0.1}, "delta"), ({"level": 0.0}, "level"),
     ({"level": 1.0}, "level"), ({"method": "nope"}, "method"), ({"choices": [(0, 0)]}, "choices"),
     ({"choices": [(3, 1)]}, "choices"), ({"choices": []}, "choices"),
     ({"scores": []}, "scores"), ({"weights": [-1.0]}, "weights"),
     ({"weights": [1.0, 1.0]}, "weights"), ({"weights": [0.0]}, "weights"),
     ({"normality_level": 0.0}, "normality_level"), ({"normality_level": 1.0}, "normality_level")],
)  # fmt: skip
def test_bad_input_names_the_parameter(kwargs, name):
    args = {"scores": [0.5, 0.1, 0.9], "included": [1, 0, 1]} | kwargs
    with pytest.raises(InvalidParameterError, match=rf"^{name}"):
        orun.one_run_audit(args.pop("scores"), args.pop("included"), **args)
    with pytest.raises(InvalidParameterError, match="^m="):
        orun.guess_candidates(0)
