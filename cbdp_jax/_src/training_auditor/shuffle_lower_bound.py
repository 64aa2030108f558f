"""A lower bound on the privacy of one epoch of shuffled-batch DP-SGD (what the Poisson accountant misses).

Implementations shuffle the data each epoch and cut it into T batches, but report the epsilon of
Poisson subsampling at q = 1 / T. Chua et al. (2024) show that the shuffled run can be far less private,
with a worst-case data set: every other example's clipped gradient is -C along one direction and the
audited example's is +C. Along that direction, in units of C and after removing the common -b of a
batch of b, the T released coordinates are

    D (example in):      P = MoG(2),   D' (its gradient zeroed):  Q = MoG(1),
    MoG(m) = (1/T) sum_t N(m e_t, S^2 I_T),

since the example sits in exactly one batch, uniformly, and zeroing it leaves its batch one -C short
of the others (under Poisson sampling a zeroed example is indistinguishable from an absent one, so it
leaves no trace). Every set gives a lower bound on the hockey-stick divergence, delta(eps) >= P(S) -
e^eps Q(S); the sets {max_t x_t > c} (and, for the other direction, {max_t x_t <= c}) have closed forms

    P(max_t x_t <= c) = Phi((c - m) / S) Phi(c / S)^(T - 1)   (for MoG(m)),

so the bound is exact up to the grid of c. It is a LOWER bound on the shuffled run's delta(eps), and so
on its epsilon at a given delta: any accountant that reports less is wrong for this data set.

Several epochs (a fresh shuffle each) compose independent copies of the one-epoch pair. Each epoch's
output is reduced to its maximum m = max_t x_t (post-processing), whose law has the closed-form CDF
above, and m is binned (post-processing again): the E-fold composition of the binned pair has
delta(eps) = E_P[(1 - e^(eps - L))_+], L the sum of E independent privacy losses log(p_i / q_i) of the
bins under P. Each loss is rounded DOWN to a grid before the sum (L only decreases, and the expectation
is nondecreasing in L), and the E-fold sum is a convolution (one FFT to the E-th power). Every step can only lower delta, so the
result is again a lower bound on the shuffled run's delta(eps), and it is computed in both directions.

References:
  Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "How Private are DP-SGD Implementations?",
  ICML 2024 (the adaptive batch linear query mechanism with shuffled batches, and its lower bound from
  the sets {max_t x_t > c}); "Scalable DP-SGD: Shuffling vs. Poisson Subsampling", NeurIPS 2024.

"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from cbdp_jax._src.infra.validation import check_in_range, check_int_at_least, check_positive

# The thresholds c tried, in units of C (the maximum of T noise draws of scale S sits near S sqrt(2 log T)).
_CAPS = np.arange(-10.0, 80.0, 0.002)


def _log_below(noise: float, steps: int, mean: float, c: np.ndarray) -> np.ndarray:
    """Log P(max_t x_t <= c) under MoG(mean), for every c given."""
    return stats.norm.logcdf((c - mean) / noise) + (steps - 1) * stats.norm.logcdf(c / noise)


def _masses(noise: float, steps: int) -> tuple[np.ndarray, ...]:
    """(P above, Q above, P below, Q below) of every set {max_t x_t > c} / {<= c}."""
    log_p, log_q = (_log_below(noise, steps, m, _CAPS) for m in (2.0, 1.0))
    return -np.expm1(log_p), -np.expm1(log_q), np.exp(log_p), np.exp(log_q)


# The bins of an epoch's maximum, in units of C, and the grid the privacy losses are rounded down to.
_EDGES = np.arange(-10.0, 80.0, 0.01)
_LOSS_GRID = 1e-3


def _bin_masses(noise: float, steps: int, mean: float) -> np.ndarray:
    """P(m in bin) under MoG(mean) for the bins of ``_EDGES`` and the two tails, accurately in both tails.

    Below the median, differences of the CDF; above it, of the survival function (expm1 of the log
    CDF), so that the upper tail keeps its relative precision.
    """
    log_f = _log_below(noise, steps, mean, _EDGES)
    f, surv = np.exp(log_f), -np.expm1(log_f)
    lower = np.diff(f, prepend=0.0, append=1.0)
    upper = -np.diff(surv, prepend=1.0, append=0.0)
    edge_f = np.concatenate([[0.0], f])  # F at each bin's lower edge
    return np.maximum(np.where(edge_f < 0.5, lower, upper), 0.0)


def _loss_pmf(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, int]:
    """The pmf under p of log(p / q) rounded down to ``_LOSS_GRID``: (masses, index of the first).

    Bins where either mass underflows to 0 are left out (their contribution to delta is dropped,
    which only lowers it).
    """
    keep = (p > 0) & (q > 0)
    k = np.floor((np.log(p[keep]) - np.log(q[keep])) / _LOSS_GRID).astype(np.int64)
    start = int(k.min())
    return np.bincount(k - start, weights=p[keep]), start


def _composed_losses(noise: float, steps: int, epochs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per direction, the pmf of the E epochs' summed (rounded-down) privacy loss, and its values.

    The E-fold convolution is one FFT raised to the E-th power; FFT rounding (~1e-16 of the mass)
    can leave tiny negative masses, set to 0.
    """
    from scipy import fft

    p, q = _bin_masses(noise, steps, 2.0), _bin_masses(noise, steps, 1.0)
    out = []
    for a, b in ((p, q), (q, p)):
        pmf, start = _loss_pmf(a, b)
        size = epochs * (pmf.size - 1) + 1
        n = fft.next_fast_len(size, real=True)
        total = fft.irfft(fft.rfft(pmf, n) ** epochs, n)[:size]
        losses = (np.arange(size) + epochs * start) * _LOSS_GRID
        out.append((np.maximum(total, 0.0), losses))
    return out


def _composed_delta(composed: list[tuple[np.ndarray, np.ndarray]], eps: float) -> float:
    """delta(eps) = E[(1 - e^(eps - L))_+] in each direction, the larger; 1e-12 off for FFT rounding."""
    best = 0.0
    for pmf, losses in composed:
        gain = -np.expm1(np.minimum(eps - losses, 0.0))
        best = max(best, float(gain @ pmf) - 1e-12)
    return best


def _delta(masses: tuple[np.ndarray, ...], eps: float) -> float:
    p_up, q_up, p_in, q_in = masses
    scale = math.exp(eps)
    return max(float(np.max(p_up - scale * q_up)), float(np.max(q_in - scale * p_in)), 0.0)


def _delta_curve(noise: float, steps: int, epochs: int):
    """``(delta(eps) function, eps tolerance of the inversion)`` of the lower bound, inputs checked."""
    check_positive("noise", noise)
    check_int_at_least("steps", steps, 1)
    check_int_at_least("epochs", epochs, 1)
    noise, steps, epochs = float(noise), int(steps), int(epochs)
    if epochs == 1:
        masses = _masses(noise, steps)
        return (lambda eps: _delta(masses, eps)), 1e-6
    composed = _composed_losses(noise, steps, epochs)
    return (lambda eps: _composed_delta(composed, eps)), 1e-4


def shuffle_lower_delta(noise: float, steps: int, eps: float, *, epochs: int = 1) -> float:
    """A lower bound on delta(eps) of shuffled DP-SGD (T batches an epoch) on the worst-case data set.

    One epoch: the larger of max_c P(max > c) - e^eps Q(max > c) and max_c Q(max <= c) - e^eps
    P(max <= c). Several: the composition of the epochs' binned maxima (module docstring). At least 0.

    Args:
      noise: The noise multiplier S (noise standard deviation over the clipping norm), > 0.
      steps: T, the batches of one epoch, >= 1.
      eps: The epsilon, >= 0.
      epochs: E, the epochs (a fresh shuffle each), >= 1.

    Raises:
      InvalidParameterError: For a parameter outside its range.

    """
    check_in_range("eps", eps, 0.0, math.inf)
    at, _ = _delta_curve(noise, steps, epochs)
    return at(float(eps))


def shuffle_lower_epsilon(noise: float, steps: int, delta: float, *, epochs: int = 1) -> float:
    """A lower bound on the epsilon at ``delta`` of shuffled DP-SGD on the worst-case data set.

    The largest eps (to 1e-6 for one epoch, 1e-4 for several; rounded down) at which
    :func:`shuffle_lower_delta` still reaches ``delta``; 0 when even eps = 0 does not.

    Examples:
      >>> from cbdp_jax.training_audit import shuffle_lower_epsilon
      >>> round(shuffle_lower_epsilon(0.8, 100, 1e-5), 2)  # Poisson at q = 1/100 reports 1.51
      5.62

    """
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    at, tol = _delta_curve(noise, steps, epochs)
    if at(0.0) < delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while at(hi) >= delta:  # delta(eps) decreases in eps
        lo, hi = hi, 2.0 * hi
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if at(mid) >= delta else (lo, mid)
    return lo


__all__ = ["shuffle_lower_delta", "shuffle_lower_epsilon"]
