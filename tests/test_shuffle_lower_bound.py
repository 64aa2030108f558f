"""The lower bound on one epoch of shuffled DP-SGD (Chua et al. 2024), against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cbdp_jax import InvalidParameterError
from cbdp_jax._src.privacy.accounting import dpsgd_epsilon
from cbdp_jax.training_audit import shuffle_lower_delta, shuffle_lower_epsilon


def _gaussian_delta(sigma: float, eps: float) -> float:
    """The exact delta(eps) of N(1, sigma^2) against N(0, sigma^2) (Balle and Wang 2018, Thm. 8)."""
    return stats.norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * stats.norm.cdf(
        -0.5 / sigma - eps * sigma
    )


@pytest.mark.parametrize("noise", [0.5, 0.8, 2.0])
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0])
def test_one_step_is_the_gaussian_mechanism(noise, eps):
    # T = 1: MoG(2) against MoG(1) is N(2, S^2) against N(1, S^2), whose optimal sets are the
    # thresholds the bound searches; it must equal the closed form up to its grid of c. The grid
    # (spacing h = 0.002) misses the optimum, a maximum, by at most h / 2, which costs at most
    # max|f''| (h / 2)^2 / 2 with f(c) = P(x > c) - e^eps Q(x > c), |f''| < (1 + e^eps) / S^2 (a
    # Gaussian density's slope is below 0.25 / S^2): under 2e-5 for these S and eps.
    got = shuffle_lower_delta(noise, 1, eps)
    want = _gaussian_delta(noise, eps)
    assert got <= want + 1e-12
    assert got == pytest.approx(want, abs=2e-5)


@pytest.mark.parametrize("steps", [2, 10, 100, 1000])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_never_above_the_mechanism_without_amplification(steps, eps):
    # Knowing the canary's step makes the pair the Gaussian mechanism of sensitivity 1; not knowing it
    # only mixes, so (joint convexity) the shuffled run's delta, and any lower bound on it, is at most
    # the Gaussian one. A wrong mass formula (e.g. T instead of T - 1 null coordinates) breaks this.
    for noise in (0.5, 1.0):
        assert shuffle_lower_delta(noise, steps, eps) <= _gaussian_delta(noise, eps) + 1e-12


def test_set_masses_match_a_monte_carlo_of_the_two_mixtures():
    # delta at eps = 0 is the largest P(S) - Q(S) over the sets {max > c} and {max <= c}; estimate
    # the same sets' masses by sampling MoG(2) and MoG(1) (T = 10, S = 0.8, 2 x 10^5 draws each) and
    # take the best set there: it must agree within 6 Monte Carlo standard errors (each mass's se is
    # at most sqrt(0.25 / 2e5) = 1.1e-3, the difference's 1.6e-3).
    rng = np.random.default_rng(0)
    steps, noise, n = 10, 0.8, 200_000

    def maxima(mean):
        x = noise * rng.standard_normal((n, steps))
        x[np.arange(n), rng.integers(0, steps, n)] += mean
        return x.max(axis=1)

    p, q = maxima(2.0), maxima(1.0)
    caps = np.linspace(0.0, 5.0, 201)
    diff = (p[:, None] > caps).mean(0) - (q[:, None] > caps).mean(0)
    assert abs(shuffle_lower_delta(noise, steps, 0.0) - diff.max()) < 6 * 1.6e-3


def test_the_epsilon_is_where_the_delta_curve_crosses():
    eps = shuffle_lower_epsilon(0.8, 100, 1e-5)
    assert shuffle_lower_delta(0.8, 100, eps) >= 1e-5
    assert shuffle_lower_delta(0.8, 100, eps + 1e-3) < 1e-5


def test_the_poisson_accountant_reports_less_than_the_shuffled_run_leaks():
    # The finding: T = 100 batches, S = 0.8. The Poisson accountant at q = 1/100 reports eps = 1.51
    # at delta = 1e-5; one shuffled epoch on the worst-case data leaks at least eps = 5.6.
    poisson = dpsgd_epsilon(0.8, 0.01, 100, 1e-5)
    assert poisson == pytest.approx(1.511, abs=0.01)
    assert shuffle_lower_epsilon(0.8, 100, 1e-5) > 3.5 * poisson
    # Negative control: no amplification at all (one Gaussian step, q = 1) bounds the shuffled run
    # from above (joint convexity), so the lower bound must stay below that accountant's eps.
    for noise in (0.8, 2.0):
        assert shuffle_lower_epsilon(noise, 100, 1e-5) <= dpsgd_epsilon(noise, 1.0, 1, 1e-5)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: shuffle_lower_delta(0.0, 10, 1.0), "noise"),
        (lambda: shuffle_lower_delta(1.0, 0, 1.0), "steps"),
        (lambda: shuffle_lower_delta(1.0, 10, -1.0), "eps"),
        (lambda: shuffle_lower_epsilon(1.0, 10, 0.0), "delta"),
        (lambda: shuffle_lower_epsilon(1.0, 10, 1.0), "delta"),
        (lambda: shuffle_lower_delta(1.0, 10, 1.0, epochs=0), "epochs"),
    ],
)
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(InvalidParameterError, match=f"{name}="):
        call()


@pytest.mark.parametrize("noise, steps", [(0.8, 100), (1.0, 1000)])
def test_one_epoch_by_composition_agrees_with_the_sets_and_stays_below(noise, steps):
    # The several-epoch machinery at E = 1 (the binned maximum's full privacy loss, rounded down) and
    # the one-epoch sets bound the same pair from below by different routes: they must agree to the
    # binning (bins of 0.01 and a loss grid of 1e-3 lose at most a few 1e-3 relative here).
    from cbdp_jax._src.training_auditor import shuffle_lower_bound as slb

    eps = np.array([0.5, 1.0, 2.0])
    losses = slb._composed_losses(noise, steps, 1)
    composed = np.array([slb._composed_delta(losses, e) for e in eps])
    sets = np.array([shuffle_lower_delta(noise, steps, e) for e in eps])
    np.testing.assert_allclose(composed, sets, rtol=5e-3)


@pytest.mark.parametrize("epochs", [2, 4])
def test_more_epochs_leak_more_but_never_more_than_no_amplification(epochs):
    # E epochs contain one epoch (dropping the others is post-processing), so the bound grows with E;
    # and knowing the canary's step in every epoch makes the pair E Gaussian steps of sensitivity 1, one
    # Gaussian of noise S / sqrt(E): the bound must stay below that curve (a composition that
    # double-counted would not).
    for eps in (1.0, 3.0):
        one = shuffle_lower_delta(0.8, 100, eps)
        many = shuffle_lower_delta(0.8, 100, eps, epochs=epochs)
        assert one <= many <= _gaussian_delta(0.8 / math.sqrt(epochs), eps) + 1e-12
    assert shuffle_lower_epsilon(0.8, 100, 1e-5, epochs=epochs) > shuffle_lower_epsilon(
        0.8, 100, 1e-5
    )


def test_several_epochs_match_a_monte_carlo_of_the_composed_maxima():
    # Two epochs of T = 10, S = 0.8: the composed bound at eps = 0 is the total variation of the
    # binned maxima's product laws, at most that of the exact pair of maxima. Estimated by sampling
    # 2 x 10^5 pairs of epochs per side, the best set among thresholds on the sum of the two epochs'
    # maxima is a lower bound on the same total variation: the composed bound must lie above it
    # (minus 6 standard errors, 6 x 1.6e-3) and below 1.
    rng = np.random.default_rng(1)
    steps, noise, n = 10, 0.8, 200_000

    def summed_maxima(mean):
        total = np.zeros(n)
        for _ in range(2):
            x = noise * rng.standard_normal((n, steps))
            x[np.arange(n), rng.integers(0, steps, n)] += mean
            total += x.max(axis=1)
        return total

    p, q = summed_maxima(2.0), summed_maxima(1.0)
    caps = np.linspace(0.0, 8.0, 321)
    threshold_tv = ((p[:, None] > caps).mean(0) - (q[:, None] > caps).mean(0)).max()
    composed = shuffle_lower_delta(noise, steps, 0.0, epochs=2)
    assert threshold_tv - 6 * 1.6e-3 <= composed <= 1.0


def _gaussian_epsilon(sigma: float, delta: float) -> float:
    """The eps at which the Gaussian mechanism's exact curve reaches delta (bisection)."""
    lo, hi = 0.0, 200.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(sigma, mid) >= delta else (lo, mid)
    return lo


@pytest.mark.parametrize("epochs", [2, 3, 4, 7, 50])
def test_the_epsilon_of_several_epochs_stays_below_no_amplification(epochs):
    # The whole curve, not just small eps: an E-fold composition that put spurious mass at large
    # losses (an inverse FFT of the wrong length once gave 166.7 for E = 4) would exceed the eps of E
    # unamplified Gaussian steps (one of noise S / sqrt(E)) at delta = 1e-5.
    got = shuffle_lower_epsilon(0.8, 100, 1e-5, epochs=epochs)
    assert (
        shuffle_lower_epsilon(0.8, 100, 1e-5)
        < got
        <= _gaussian_epsilon(0.8 / math.sqrt(epochs), 1e-5)
    )
