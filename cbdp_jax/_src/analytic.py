"""Closed forms and bounds for the Laplace and Gaussian mechanisms, restricted and unrestricted.

Setting (docs/theory/mechanisms.md). The Laplace mechanism gives P = Lap(0, 1/eps)^d and Q = Lap(v, 1/eps), i.e.
coordinate i of Q is shifted by the sensitivity v_i; the Gaussian mechanism gives P = N(0, s^2 I_d) and
Q = N(v, s^2 I_d). ``sensitivity`` is either a number (d = 1) or the vector v (d = len(v)); only |v_i|
matters. Every function here is a plain float function of Python numbers (numpy inside, no JAX): these
are the reference values that the exact (quadrature) and learned layers are checked against.

The lin class is h(x) = a . x + b on R^d (identity feature map). Restricted values are reported for it
(``*_lin_*``); everything else is the unrestricted divergence.

Numerics: every formula is evaluated in a form without catastrophic cancellation (series for
exp(z) - 1 - z and log(1 + y) - y near zero) and, where exponentials can overflow (large alpha times
eps), in log space with log1p / logaddexp. Inputs up to alpha = 100, eps = 20 give finite values.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019: Table 1,
  eq. (4), Theorems 5, 6, 7 (and Theorem 13 / Corollary 2 of its appendix). docs/theory/divergences.md, mechanisms.md and generalization.md.

"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_alpha,
    check_choice,
    check_finite_scalar,
    check_int_at_least,
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


def laplace_renyi_lower_bound(
    alpha: float, epsilon: float, sensitivity: SensitivityLike = 1.0
) -> float:
    """The paper's lower bound on the Laplace Renyi-DP parameter: eps ||v||_1 - d log 2 / (alpha - 1).

    It follows from eq. (4) by dropping the e^{-alpha e} term and using alpha/(2alpha-1) > 1/2.

    Args:
      alpha: The Renyi order, > 1.
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector (d = its length).

    Returns:
      A lower bound on :func:`laplace_renyi` (possibly negative for small eps).

    Raises:
      InvalidParameterError: If alpha <= 1, or epsilon or sensitivity is invalid.

    References:
      Paper Table 1 (alpha-Renyi, Laplace, unrestricted); docs/theory/mechanisms.md.

    """
    a = check_alpha(alpha)
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    return eps * float(np.sum(v)) - v.size * _LOG2 / (a - 1.0)


def laplace_lin_renyi_upper_bound(
    alpha: float,
    epsilon: float,
    sensitivity: SensitivityLike = 1.0,
    *,
    form: str = "corrected",
) -> float:
    """Upper bound on the (lin, Renyi) parameter of the Laplace mechanism, alpha >= 2.

    - ``form="paper"``: the bound as printed in Table 1,
      (1/(alpha-1)) log(1 + 2^{d(alpha-1)} (eps ||v||_alpha)^alpha).
      It is NOT valid everywhere: at eps = 0.5, alpha = 4 (d = 1) it gives 0.135155 while the exact
      (lin, Renyi) value is 0.148649 (docs/theory/mechanisms.md).
    - ``form="corrected"``: docs/theory/mechanisms.md's valid bound, which keeps the factor 2^{-d} that the
      proof of Theorem 13 drops from the term C_a b^A:
      d log 2 + (1/(alpha-1)) log(1 + (eps ||v||_alpha)^alpha). It holds for the paper's |t|
      convention of the alpha-divergence (not for the t >= 0 variant).

    Both are evaluated in log space (logaddexp, logsumexp for ||v||_alpha^alpha), so large alpha does
    not overflow.

    Args:
      alpha: The Renyi order, >= 2.
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector (d = its length).
      form: ``"corrected"`` (default, valid) or ``"paper"`` (as printed).

    Returns:
      The bound.

    Raises:
      InvalidParameterError: If alpha < 2 (or <= 1), epsilon or sensitivity is invalid, or form is not
        one of ``BOUND_FORMS``.

    References:
      Paper Table 1 (alpha-Renyi, Laplace, linear adversary), appendix Theorem 13 / Corollary 2;
      docs/theory/mechanisms.md.

    """
    a = _check_upper_bound_alpha(alpha)
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    check_choice("form", form, BOUND_FORMS)
    d = v.size
    log_term = a * math.log(eps) + _log_norm_pow(v, a)  # log((eps ||v||_alpha)^alpha)
    if form == "paper":
        return _log1pexp(d * (a - 1.0) * _LOG2 + log_term) / (a - 1.0)
    return d * _LOG2 + _log1pexp(log_term) / (a - 1.0)


def gaussian_lin_renyi_upper_bound(
    alpha: float,
    sigma: float,
    sensitivity: SensitivityLike = 1.0,
    *,
    form: str = "corrected",
) -> float:
    """Upper bound on the (lin, Renyi) parameter of the Gaussian mechanism, alpha >= 2.

    - ``form="paper"``: Table 1's
      (1/(alpha-1)) log(1 + 2^{d(alpha-1)} (pi/2)^{(alpha-1)/2} ||v||_alpha^alpha / sigma^alpha)
      (for d = 1 this is the 1-D row's sqrt(2 pi)^{alpha-1} / sigma^alpha). Not valid everywhere: at
      sigma = 2, alpha = 4 it gives 0.228431 while the exact (lin, Renyi) value is 0.259270.
    - ``form="corrected"``: docs/theory/mechanisms.md's valid bound
      d log 2 + (1/(alpha-1)) log(1 + (pi/2)^{(alpha-1)/2} ||v||_alpha^alpha / sigma^alpha).

    Evaluated in log space, so large alpha does not overflow.

    Args:
      alpha: The Renyi order, >= 2.
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector (d = its length).
      form: ``"corrected"`` (default, valid) or ``"paper"`` (as printed).

    Returns:
      The bound.

    Raises:
      InvalidParameterError: If alpha < 2, sigma or sensitivity is invalid, or form is unknown.

    References:
      Paper Table 1 (alpha-Renyi, Gaussian, linear adversary), appendix Theorem 13 / Corollary 2;
      docs/theory/mechanisms.md.

    """
    a = _check_upper_bound_alpha(alpha)
    s = check_positive("sigma", sigma)
    v = _abs_sensitivity(sensitivity)
    check_choice("form", form, BOUND_FORMS)
    d = v.size
    log_term = 0.5 * (a - 1.0) * math.log(math.pi / 2.0) + _log_norm_pow(v, a) - a * math.log(s)
    if form == "paper":
        return _log1pexp(d * (a - 1.0) * _LOG2 + log_term) / (a - 1.0)
    return d * _LOG2 + _log1pexp(log_term) / (a - 1.0)


def matrix_mechanism_lin_renyi_upper_bound(
    alpha: float, epsilon: float, strategy_rows: int, *, form: str = "corrected"
) -> float:
    """Upper bound on the (lin, Renyi) parameter of the matrix mechanism (Theorem 5).

    M_A(W, x, eps) = W A^+ (A x + ||A||_1 Lap_s(0, 1/eps)) with A an s x n strategy matrix and
    ||A||_1 its largest column L1 norm. Neighbouring count vectors differ by a unit vector e_j, so the
    noisy vector A x / ||A||_1 + Lap_s(0, 1/eps) is an s-dimensional Laplace mechanism with sensitivity
    vector v = A e_j / ||A||_1, for which ||v||_alpha <= ||v||_1 <= 1. The release is a linear map of it,
    so post-processing (Theorem 1, with linear G, H, I) keeps its (lin, Renyi) parameter, and both
    d-dimensional Laplace bounds increase in ||v||_alpha. Hence the s-dimensional Laplace bound with
    d = s and ||v||_alpha = 1, which is exactly the paper's statement:

    - ``form="paper"``: (1/(alpha-1)) log(1 + 2^{s(alpha-1)} eps^alpha), as printed in Theorem 5; it
      inherits the flaw of the printed Table 1 bound (it is that bound with d = s).
    - ``form="corrected"``: s log 2 + (1/(alpha-1)) log(1 + eps^alpha), the corrected Laplace bound of
      docs/theory/mechanisms.md with d = s and ||v||_alpha = 1.

    A tighter value for a given A is :func:`laplace_lin_renyi_upper_bound` with
    sensitivity = A e_j / ||A||_1, maximised over the columns j.

    Args:
      alpha: The Renyi order, >= 2.
      epsilon: The Laplace privacy parameter eps > 0.
      strategy_rows: s, the number of rows of the strategy matrix A (an integer >= 1).
      form: ``"corrected"`` (default, valid) or ``"paper"`` (as printed).

    Returns:
      The bound.

    Raises:
      InvalidParameterError: If alpha < 2, epsilon is invalid, strategy_rows is not an integer >= 1, or
        form is unknown.

    References:
      Paper Theorem 5, Theorem 1 (post-processing), Table 1; docs/theory/capacity_bounded_dp.md and mechanisms.md.

    """
    s = check_int_at_least("strategy_rows", strategy_rows, 1)
    # d = s coordinates with ||v||_alpha = 1: the worst case allowed by ||v||_1 <= 1.
    unit = np.zeros(s)
    unit[0] = 1.0
    return laplace_lin_renyi_upper_bound(alpha, epsilon, unit, form=form)


# --------------------------------------------------------------------------------------------------
# Generalization (section 6) and Pinsker
# --------------------------------------------------------------------------------------------------


def pinsker_ipm_bound(kl_restricted: float) -> float:
    """Pinsker-like bound for restricted divergences (Theorem 7): IPM^H(P, Q) <= 8 sqrt(KL^H(P, Q)).

    Holds for H convex, translation invariant, closed under negation, with range [-1, 1].

    Args:
      kl_restricted: KL^H(P, Q), a number >= 0 (+inf allowed).

    Returns:
      8 sqrt(KL^H).

    Raises:
      InvalidParameterError: If kl_restricted is negative or NaN.

    References:
      Paper Theorem 7; docs/theory/generalization.md.

    """
    k = _check_nonneg_or_inf("kl_restricted", kl_restricted)
    return 8.0 * math.sqrt(k)


def generalization_gap_bound(epsilon: float) -> float:
    """Generalization gap of a (H, KL) capacity bounded private statistical query (Theorem 6): 8 sqrt(eps).

    If M outputs a statistical query q_S and is (H, KL) private with parameter eps, where H contains every
    h_x(q) = q(x), then |E[(1/n) sum_i q_S(x_i) - E_{x~D} q_S(x)]| <= 8 sqrt(eps).

    Args:
      epsilon: The (H, KL) privacy parameter, a number >= 0 (+inf allowed).

    Returns:
      8 sqrt(eps).

    Raises:
      InvalidParameterError: If epsilon is negative or NaN.

    References:
      Paper Theorem 6; docs/theory/generalization.md.

    """
    e = _check_nonneg_or_inf("epsilon", epsilon)
    return 8.0 * math.sqrt(e)


def classical_pinsker_tv_bound(kl: float) -> float:
    """Pinsker's inequality: TV(P, Q) = sup_{h in [0, 1]} |E_P h - E_Q h| <= sqrt(KL(P, Q) / 2).

    Args:
      kl: The unrestricted KL(P, Q), a number >= 0 (+inf allowed).

    Returns:
      sqrt(KL / 2).

    Raises:
      InvalidParameterError: If kl is negative or NaN.

    References:
      Pinsker's inequality; compare paper Theorem 7 (its restricted analogue), docs/theory/generalization.md.

    """
    k = _check_nonneg_or_inf("kl", kl)
    return math.sqrt(k / 2.0)


def classical_pinsker_ipm_bound(kl: float) -> float:
    """Pinsker's inequality for [-1, 1]-valued h: sup_h |E_P h - E_Q h| = 2 TV(P, Q) <= sqrt(2 KL).

    Args:
      kl: The unrestricted KL(P, Q), a number >= 0 (+inf allowed).

    Returns:
      sqrt(2 KL).

    Raises:
      InvalidParameterError: If kl is negative or NaN.

    References:
      Pinsker's inequality; compare paper Theorem 7 (constant 8 there), docs/theory/generalization.md.

    """
    k = _check_nonneg_or_inf("kl", kl)
    return math.sqrt(2.0 * k)


# --------------------------------------------------------------------------------------------------
# Other unrestricted closed forms: TV, chi^2, squared Hellinger
# --------------------------------------------------------------------------------------------------


def laplace_tv(epsilon: float, sensitivity: float = 1.0) -> float:
    """Total variation between Lap(0, 1/eps) and Lap(v, 1/eps): 1 - exp(-eps |v| / 2). One-dimensional.

    TV does not factor over coordinates, and no d-dimensional form is provided.

    Args:
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number (or a length-1 vector).

    Returns:
      TV(P, Q) = (1/2) integral |p - q|.

    Raises:
      InvalidParameterError: If epsilon is invalid or sensitivity has more than one entry.

    References:
      docs/theory/divergences.md (total variation, f(t) = |t - 1|/2) and section 6 (setting).

    """
    eps = check_positive("epsilon", epsilon)
    v = _scalar_sensitivity(sensitivity, "Laplace total variation")
    return -math.expm1(-0.5 * eps * v)


def gaussian_tv(sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Total variation of the Gaussian mechanism: 2 Phi(||v||_2 / (2 sigma)) - 1 = erf(||v||_2 / (2 sqrt2 sigma)).

    N(0, s^2 I) and N(v, s^2 I) are rotation invariant, so the d-dimensional TV is the 1-D TV with shift
    ||v||_2.

    Args:
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      TV(P, Q).

    Raises:
      InvalidParameterError: If sigma or sensitivity is invalid.

    References:
      docs/theory/divergences.md and mechanisms.md.

    """
    s = check_positive("sigma", sigma)
    v = _abs_sensitivity(sensitivity)
    return math.erf(float(np.linalg.norm(v)) / (2.0 * math.sqrt(2.0) * s))


def laplace_chi2(epsilon: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Pearson chi^2(P || Q) = integral p^2 / q - 1 for the Laplace mechanism, d-dimensional.

    1 + chi^2 = exp(D_2(P || Q)) and 1 + chi^2 multiplies over independent coordinates, so
    chi^2 = expm1(sum_i D_2,i) = prod_i (2/3 e^{e_i} + 1/3 e^{-2 e_i}) - 1.

    Args:
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      chi^2(P || Q) (+inf if it overflows float64).

    Raises:
      InvalidParameterError: If epsilon or sensitivity is invalid.

    References:
      docs/theory/divergences.md (Pearson chi^2, f(t) = (t - 1)^2) and section 6; paper eq. (4) at alpha = 2.

    """
    return _safe_expm1(laplace_renyi(2.0, epsilon, sensitivity))


def gaussian_chi2(sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Pearson chi^2(P || Q) for the Gaussian mechanism: exp(||v||_2^2 / sigma^2) - 1.

    Args:
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      chi^2(P || Q) (+inf if it overflows float64).

    Raises:
      InvalidParameterError: If sigma or sensitivity is invalid.

    References:
      docs/theory/divergences.md and mechanisms.md.

    """
    return _safe_expm1(gaussian_renyi(2.0, sigma, sensitivity))


def laplace_hellinger(epsilon: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Squared Hellinger distance (f = (sqrt t - 1)^2) of the Laplace mechanism, d-dimensional.

    H^2 = integral (sqrt p - sqrt q)^2 = 2 (1 - BC), BC = integral sqrt(p q). In one dimension
    BC = (1 + e/2) exp(-e/2) with e = eps |v|; BC multiplies over independent coordinates, so
    H^2 = -2 expm1(sum_i (log1p(e_i/2) - e_i/2)), evaluated by series for small e_i.

    Args:
      epsilon: The Laplace privacy parameter eps > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      H^2(P, Q), in [0, 2].

    Raises:
      InvalidParameterError: If epsilon or sensitivity is invalid.

    References:
      docs/theory/divergences.md (squared Hellinger) and section 6.

    """
    eps = check_positive("epsilon", epsilon)
    v = _abs_sensitivity(sensitivity)
    log_bc = math.fsum(_log1p_minus_x(0.5 * eps * float(vi)) for vi in v)
    return -2.0 * math.expm1(log_bc)


def gaussian_hellinger(sigma: float, sensitivity: SensitivityLike = 1.0) -> float:
    """Squared Hellinger distance (f = (sqrt t - 1)^2) of the Gaussian mechanism: 2 (1 - exp(-||v||^2/(8 s^2))).

    Args:
      sigma: The noise standard deviation s > 0.
      sensitivity: The sensitivity v, a number or a vector.

    Returns:
      H^2(P, Q), in [0, 2].

    Raises:
      InvalidParameterError: If sigma or sensitivity is invalid.

    References:
      docs/theory/divergences.md and mechanisms.md.

    """
    return -2.0 * math.expm1(-gaussian_kl(sigma, sensitivity) / 4.0)


# --------------------------------------------------------------------------------------------------
# Where the upper bound falls below Renyi-DP
# --------------------------------------------------------------------------------------------------


def lin_renyi_crossing_alpha(
    mechanism: str,
    *,
    epsilon: float | None = None,
    sigma: float | None = None,
    sensitivity: SensitivityLike = 1.0,
    form: str = "corrected",
    lo: float = 2.0,
    hi: float = 50.0,
) -> float:
    """The order alpha at which the (lin, Renyi) upper bound falls below the exact Renyi-DP parameter.

    Scans [lo, hi] on a grid of 513 points for the first sign change of bound(alpha) - RDP(alpha) from
    positive to non-positive, then bisects in float64 to the last bit. Past this alpha the upper bound
    certifies that a linear adversary gains strictly less than an unrestricted one.

    docs/theory/mechanisms.md states: Laplace eps = 1: printed bound near 3.3, corrected near 5.19; Gaussian
    sigma = 1: printed near 2.3, corrected near 2.53.

    Args:
      mechanism: ``"laplace"`` or ``"gaussian"``.
      epsilon: The Laplace privacy parameter (required for ``"laplace"``).
      sigma: The Gaussian noise standard deviation (required for ``"gaussian"``).
      sensitivity: The sensitivity v, a number or a vector.
      form: ``"corrected"`` (default) or ``"paper"``, passed to the upper bound.
      lo: Lower end of the search interval, >= 2 (the bounds need alpha >= 2).
      hi: Upper end of the search interval, > lo.

    Returns:
      The crossing order alpha.

    Raises:
      InvalidParameterError: For an unknown mechanism or form, a missing or invalid epsilon / sigma, an
        invalid interval, or if the bound is not above Renyi-DP at lo and below it somewhere in (lo, hi]
        (no crossing in the interval; the message names lo / hi).

    References:
      Paper Figures 1a and 2a and the discussion after eq. (4); docs/theory/mechanisms.md.

    """
    check_choice("mechanism", mechanism, MECHANISMS)
    check_choice("form", form, BOUND_FORMS)
    lo_f = check_finite_scalar("lo", lo)
    hi_f = check_finite_scalar("hi", hi)
    if lo_f < 2.0:
        raise InvalidParameterError(
            f"lo={lo!r} is invalid: must be >= 2 (the upper bounds need it)"
        )
    if hi_f <= lo_f:
        raise InvalidParameterError(f"hi={hi!r} is invalid: must be > lo={lo!r}")
    v = _abs_sensitivity(sensitivity)

    gap: Callable[[float], float]
    if mechanism == "laplace":
        if epsilon is None:
            raise InvalidParameterError(
                "epsilon=None is invalid: must be given (a number > 0) for mechanism 'laplace'"
            )
        eps = check_positive("epsilon", epsilon)

        def gap(a: float) -> float:
            return laplace_lin_renyi_upper_bound(a, eps, v, form=form) - laplace_renyi(a, eps, v)

    else:
        if sigma is None:
            raise InvalidParameterError(
                "sigma=None is invalid: must be given (a number > 0) for mechanism 'gaussian'"
            )
        s = check_positive("sigma", sigma)

        def gap(a: float) -> float:
            return gaussian_lin_renyi_upper_bound(a, s, v, form=form) - gaussian_renyi(a, s, v)

    if not gap(lo_f) > 0.0:
        raise InvalidParameterError(
            f"lo={lo!r} is invalid: the upper bound is already at or below Renyi-DP there "
            f"(gap {gap(lo_f):.6g}); no crossing in [lo, hi]"
        )
    grid = np.linspace(lo_f, hi_f, 513)
    left = lo_f
    for a in grid[1:]:
        a = float(a)
        if gap(a) <= 0.0:
            right = a
            break
        left = a
    else:
        raise InvalidParameterError(
            f"hi={hi!r} is invalid: the upper bound stays above Renyi-DP on [lo, hi]; no crossing"
        )
    for _ in range(200):
        mid = 0.5 * (left + right)
        if mid <= left or mid >= right:
            break
        if gap(mid) > 0.0:
            left = mid
        else:
            right = mid
    return 0.5 * (left + right)
