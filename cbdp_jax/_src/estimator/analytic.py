"""Closed forms and bounds for the Laplace and Gaussian mechanisms, restricted and unrestricted.

Setting (docs/theory/mechanisms.md). The Laplace mechanism gives P = Lap(0, 1/eps)^d and Q = Lap(v, 1/eps), i.e.
coordinate i of Q is shifted by the sensitivity v_i; the Gaussian mechanism gives P = N(0, s^2 I_d) and
Q = N(v, s^2 I_d). ``sensitivity`` is either a number (d = 1) or the vector v (d = len(v)); only |v_i|
matters. Every function here is a plain float function of Python numbers (numpy inside, no JAX): these
are the reference values that the exact (quadrature) and learned layers are checked against.

The lin class is h(x) = a . x + b on R^d (identity feature map). Restricted values are reported for it
(``*_lin_*``); everything else is the unrestricted divergence.

This module holds the stable scalar helpers and the KL and Renyi closed forms (Table 1); the Renyi
bounds of the lin class are in :mod:`analytic_renyi_bounds`, generalization and Pinsker in
:mod:`analytic_pinsker`, the TV, chi^2 and Hellinger closed forms in
:mod:`analytic_tv_chi2_hellinger`.

Numerics: every formula is evaluated in a form without catastrophic cancellation (series for
exp(z) - 1 - z and log(1 + y) - y near zero) and, where exponentials can overflow (large alpha times
eps), in log space with log1p / logaddexp. Inputs up to alpha = 100, eps = 20 give finite values.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019: Table 1,
  eq. (4), Theorems 5, 6, 7 (and Theorem 13 / Corollary 2 of its appendix). docs/theory/divergences.md, mechanisms.md and generalization.md.

"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_alpha,
    check_finite_scalar,
    check_positive,
    check_vector,
)

SensitivityLike = float | Sequence[float] | np.ndarray


BOUND_FORMS = ("corrected", "paper")


MECHANISMS = ("laplace", "gaussian")


_LOG2 = math.log(2.0)


_SERIES_CUTOFF = 0.5  # |z| below this: power series (terms fall by >= 2x each, 30 terms suffice)


# --------------------------------------------------------------------------------------------------
# Stable scalar helpers
# --------------------------------------------------------------------------------------------------


def _expm1_minus_x(z: float) -> float:
    """exp(z) - 1 - z without cancellation near 0 (series for |z| < 1/2)."""
    if abs(z) < _SERIES_CUTOFF:
        total, term = 0.0, z
        for k in range(2, 32):
            term *= z / k
            total += term
        return total
    return math.expm1(z) - z


def _log1p_minus_x(y: float) -> float:
    """log(1 + y) - y for y > -1, without cancellation near 0 (series for |y| < 1/2)."""
    if abs(y) < _SERIES_CUTOFF:
        total, power = 0.0, y
        for k in range(2, 64):
            power *= -y
            total += power / k  # (-1)^(k+1) y^k / k, with the sign carried by ``power``
        return total
    return math.log1p(y) - y


def _log1pexp(x: float) -> float:
    """log(1 + exp(x)) for x in [-inf, inf), without overflow."""
    if x == -math.inf:
        return 0.0
    if x > 0:
        return x + math.log1p(math.exp(-x))
    return math.log1p(math.exp(x))


def _safe_expm1(x: float) -> float:
    """expm1 that returns +inf instead of raising OverflowError."""
    return math.inf if x > 709.0 else math.expm1(x)


def _abs_sensitivity(sensitivity: SensitivityLike) -> np.ndarray:
    return np.abs(check_vector("sensitivity", sensitivity))


def _log_norm_pow(v: np.ndarray, alpha: float) -> float:
    """log(||v||_alpha^alpha) = logsumexp(alpha log|v_i|); -inf for v = 0. No overflow for large alpha."""
    nz = v[v > 0]
    if nz.size == 0:
        return -math.inf
    terms = alpha * np.log(nz)
    m = float(np.max(terms))
    return m + math.log(float(np.sum(np.exp(terms - m))))


def _check_upper_bound_alpha(alpha: float) -> float:
    a = check_alpha(alpha)
    if a < 2.0:
        raise InvalidParameterError(
            f"alpha={alpha!r} is invalid: must be >= 2 (the (lin, Renyi) upper bounds of Theorem 13 / "
            "Corollary 2 use alpha/(alpha-1) in [1, 2])"
        )
    return a


def _check_nonneg_or_inf(name: str, value: float) -> float:
    """A divergence value: a number >= 0, +inf allowed."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if x == math.inf:
        return x
    x = check_finite_scalar(name, value)
    if x < 0:
        raise InvalidParameterError(f"{name}={value!r} is invalid: must be >= 0")
    return x


def _scalar_sensitivity(sensitivity: SensitivityLike, what: str) -> float:
    v = _abs_sensitivity(sensitivity)
    if v.size != 1:
        raise InvalidParameterError(
            f"sensitivity={sensitivity!r} is invalid: must be a number or a length-1 vector "
            f"({what} has no closed form for d > 1 here)"
        )
    return float(v[0])


# --------------------------------------------------------------------------------------------------
# KL (Table 1, rows 1-2)
# --------------------------------------------------------------------------------------------------


def laplace_kl(epsilon: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Unrestricted KL divergence of the Laplace mechanism: sum_i (e_i - 1 + exp(-e_i)), e_i = eps |v_i|.

    KL is additive over independent coordinates. Each term is exp(-e) - 1 + e, evaluated by its power
    series for small e (no cancellation).

    Args:
      epsilon: The Laplace privacy parameter eps > 0 (noise scale 1/eps).
      sensitivity: The sensitivity v, a number (d = 1) or a vector of per-coordinate sensitivities.

    Returns:
      KL(P || Q) (= KL(Q || P) by symmetry of the Laplace density).

    Raises:
      InvalidParameterError: If epsilon is not a finite number > 0 or sensitivity is not a finite
        non-empty vector.

    References:
      Paper Table 1 (KL, Laplace, unrestricted); docs/theory/mechanisms.md.

    """
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    return math.fsum(_expm1_minus_x(-eps * float(vi)) for vi in v)


def _laplace_lin_kl_1d(e: float) -> float:
    # With s = sqrt(1 + e^2) and r = (s - 1)/e the printed form is log(1 - r^2) + s - 1. Since
    # 1 - r^2 = 2/(1 + s) exactly, it equals u - log1p(u/2) with u = s - 1 = e^2/(1 + s): no
    # cancellation for small e (u - log1p(u/2) = u/2 + u^2/8 - ...) and no overflow for large e.
    if e == 0.0:
        return 0.0
    s = math.hypot(1.0, e)
    u = e * (e / (1.0 + s))
    return 0.5 * u - _log1p_minus_x(0.5 * u)


def laplace_lin_kl(epsilon: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Exact (lin, KL) parameter of the Laplace mechanism (Table 1).

    Per coordinate, with e = eps |v_i|:  g(e) = log(1 - ((1 - sqrt(1+e^2))/e)^2) + sqrt(1+e^2) - 1,
    evaluated as u - log1p(u/2) with u = sqrt(1+e^2) - 1 = e^2/(1 + sqrt(1+e^2)) (the same number: the
    argument of the first log is 2/(1 + sqrt(1+e^2))), which is stable for small and large e.

    The d-dimensional value is sum_i g(eps |v_i|). Reason: the lin class is translation invariant, so
    (lin, KL) is the Donsker-Varadhan supremum sup_a E_P[a.x] - log E_Q[exp(a.x)] (docs/theory/objectives.md,
    paper Lemma 1). Under independent coordinates E_Q[exp(a.x)] = prod_i E_Q[exp(a_i x_i)], so the
    objective is a sum of per-coordinate objectives in separate variables a_i and the supremum is the
    sum of the one-dimensional suprema.

    Args:
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      KL^lin(P || Q) <= KL(P || Q).

    Raises:
      InvalidParameterError: If epsilon or sensitivity is invalid.

    References:
      Paper Table 1 (KL, Laplace, linear adversary), Lemma 1; docs/theory/objectives.md and mechanisms.md.

    """
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    return math.fsum(_laplace_lin_kl_1d(eps * float(vi)) for vi in v)


def gaussian_kl(sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Unrestricted KL divergence of the Gaussian mechanism: ||v||_2^2 / (2 sigma^2).

    Args:
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      KL(P || Q).

    Raises:
      InvalidParameterError: If sigma or sensitivity is invalid.

    References:
      Paper Table 1 (KL, Gaussian); docs/theory/mechanisms.md.

    """
    s = check_positive("sigma", sigma)
    v = _abs_sensitivity(sensitivity)
    return float(np.sum((v / s) ** 2)) / 2.0


def gaussian_lin_kl(sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Exact (lin, KL) parameter of the Gaussian mechanism: equal to the unrestricted KL.

    The optimal h of the variational form, log(dP/dQ) + 1, is linear for two Gaussians with the same
    covariance, so restricting to lin loses nothing.

    Args:
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      KL^lin(P || Q) = ||v||_2^2 / (2 sigma^2).

    Raises:
      InvalidParameterError: If sigma or sensitivity is invalid.

    References:
      Paper Table 1 (KL, Gaussian, linear adversary); docs/theory/mechanisms.md.

    """
    return gaussian_kl(sigma, sensitivity)


# --------------------------------------------------------------------------------------------------
# Renyi (Table 1, rows 3-6; eq. 4)
# --------------------------------------------------------------------------------------------------


def _laplace_renyi_1d_scaled(alpha: float, e: float) -> float:
    """(alpha - 1) times the Renyi divergence of order alpha between Lap(0, 1) and Lap(e, 1), e >= 0."""
    am1 = alpha - 1.0
    if am1 * e <= _SERIES_CUTOFF:
        # The argument of the log in eq. (4) is 1 + X with
        # X = [alpha (e^{(alpha-1)e} - 1) + (alpha-1)(e^{-alpha e} - 1)] / (2 alpha - 1); the linear
        # terms alpha (alpha-1) e cancel exactly, leaving two non-negative exp(z) - 1 - z terms.
        x = (alpha * _expm1_minus_x(am1 * e) + am1 * _expm1_minus_x(-alpha * e)) / (
            2.0 * alpha - 1.0
        )
        return math.log1p(x)
    # Log space: (alpha-1) e + log(alpha/(2alpha-1)) + log1p(((alpha-1)/alpha) e^{-(2alpha-1)e}).
    # Here (alpha-1) e > 1/2 and the result is >= (alpha-1) e - log 2 + (positive), no overflow.
    return (
        am1 * e
        + math.log(alpha / (2.0 * alpha - 1.0))
        + math.log1p((am1 / alpha) * math.exp(-(2.0 * alpha - 1.0) * e))
    )


def laplace_renyi(alpha: float, epsilon: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Exact Renyi-DP parameter of the Laplace mechanism (paper eq. 4, d-dimensional).

    (1/(alpha-1)) sum_i log((1/2 + 1/(4alpha-2)) e^{(alpha-1) e_i} + (1/2 - 1/(4alpha-2)) e^{-alpha e_i}),
    e_i = eps |v_i|: Renyi divergences add over independent coordinates. Evaluated without overflow
    for large alpha * eps (log space) and without cancellation for small eps (series).

    Args:
      alpha: The Renyi order, > 1.
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      D_alpha(P || Q).

    Raises:
      InvalidParameterError: If alpha <= 1 (alpha = 1 is KL: use :func:`laplace_kl`), or epsilon or
        sensitivity is invalid.

    References:
      Paper eq. (4) and Table 1; Mironov (2017), Proposition 6; docs/theory/mechanisms.md.

    """
    a = check_alpha(alpha)
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    return math.fsum(_laplace_renyi_1d_scaled(a, eps * float(vi)) for vi in v) / (a - 1.0)


def gaussian_renyi(alpha: float, sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Exact Renyi-DP parameter of the Gaussian mechanism: alpha ||v||_2^2 / (2 sigma^2).

    Args:
      alpha: The Renyi order, > 1.
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      D_alpha(P || Q).

    Raises:
      InvalidParameterError: If alpha <= 1, or sigma or sensitivity is invalid.

    References:
      Paper Table 1 (alpha-Renyi, Gaussian, unrestricted); docs/theory/mechanisms.md.

    """
    a = check_alpha(alpha)
    return a * gaussian_kl(sigma, sensitivity)
