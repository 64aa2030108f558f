"""Bounds on the Renyi divergence of the Laplace, Gaussian and matrix mechanisms for the lin class.

The restricted Renyi upper bounds (paper Theorems 5-7, in their corrected and paper forms), the lower
bound on Laplace Renyi, and the order alpha above which the lin-class upper bound falls below the
unrestricted Renyi divergence. Plain float functions of Python numbers, like :mod:`analytic`'s.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019.
  docs/theory/divergences.md, mechanisms.md and generalization.md.

"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cbdp_jax._src.estimator.analytic import (
    _LOG2,
    BOUND_FORMS,
    MECHANISMS,
    SensitivityLike,
    _abs_sensitivity,
    _check_upper_bound_alpha,
    _log1pexp,
    _log_norm_pow,
    gaussian_renyi,
    laplace_renyi,
)
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_alpha,
    check_choice,
    check_finite_scalar,
    check_int_at_least,
    check_positive,
)


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
