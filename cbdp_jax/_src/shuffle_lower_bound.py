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

References:
  Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "How Private are DP-SGD Implementations?",
  ICML 2024 (the adaptive batch linear query mechanism with shuffled batches, and its lower bound from
  the sets {max_t x_t > c}); "Scalable DP-SGD: Shuffling vs. Poisson Subsampling", NeurIPS 2024.

"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from cbdp_jax._src.validation import check_in_range, check_int_at_least, check_positive

# The thresholds c tried, in units of C (the maximum of T noise draws of scale S sits near S sqrt(2 log T)).
_CAPS = np.arange(-10.0, 80.0, 0.002)


def _log_below(noise: float, steps: int, mean: float) -> np.ndarray:
    """Log P(max_t x_t <= c) under MoG(mean), for every c of the grid."""
    return stats.norm.logcdf((_CAPS - mean) / noise) + (steps - 1) * stats.norm.logcdf(
        _CAPS / noise
    )


def _masses(noise: float, steps: int) -> tuple[np.ndarray, ...]:
    """(P above, Q above, P below, Q below) of every set {max_t x_t > c} / {<= c}."""
    log_p, log_q = _log_below(noise, steps, 2.0), _log_below(noise, steps, 1.0)
    return -np.expm1(log_p), -np.expm1(log_q), np.exp(log_p), np.exp(log_q)


def _delta(masses: tuple[np.ndarray, ...], eps: float) -> float:
    p_up, q_up, p_in, q_in = masses
    scale = math.exp(eps)
    return max(float(np.max(p_up - scale * q_up)), float(np.max(q_in - scale * p_in)), 0.0)


def shuffle_lower_delta(noise: float, steps: int, eps: float) -> float:
    """A lower bound on delta(eps) of one epoch of T shuffled batches on the worst-case data set.

    The larger of max_c P(max > c) - e^eps Q(max > c) and max_c Q(max <= c) - e^eps P(max <= c)
    (module docstring), at least 0.

    Args:
      noise: The noise multiplier S (noise standard deviation over the clipping norm), > 0.
      steps: T, the batches of the epoch, >= 1.
      eps: The epsilon, >= 0.

    Raises:
      InvalidParameterError: For a parameter outside its range.

    """
    check_positive("noise", noise)
    check_int_at_least("steps", steps, 1)
    check_in_range("eps", eps, 0.0, math.inf)
    return _delta(_masses(float(noise), int(steps)), float(eps))


def shuffle_lower_epsilon(noise: float, steps: int, delta: float) -> float:
    """A lower bound on the epsilon at ``delta`` of one epoch of T shuffled batches (worst-case data).

    The largest eps (to 1e-6, rounded down) at which :func:`shuffle_lower_delta` still reaches
    ``delta``; 0 when even eps = 0 does not.

    Examples:
      >>> from cbdp_jax.training_audit import shuffle_lower_epsilon
      >>> round(shuffle_lower_epsilon(0.8, 100, 1e-5), 2)  # Poisson at q = 1/100 reports 1.51
      5.62

    """
    check_positive("noise", noise)
    check_int_at_least("steps", steps, 1)
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    masses = _masses(float(noise), int(steps))
    if _delta(masses, 0.0) < delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _delta(masses, hi) >= delta:  # delta(eps) decreases in eps
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _delta(masses, mid) >= delta else (lo, mid)
    return lo


__all__ = ["shuffle_lower_delta", "shuffle_lower_epsilon"]
