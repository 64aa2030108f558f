"""Other unrestricted closed forms of the Laplace and Gaussian mechanisms: TV, chi^2, squared Hellinger.

Plain float functions of Python numbers (the reference values of :mod:`analytic`'s setting).

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019.
  docs/theory/divergences.md, mechanisms.md and generalization.md.

"""

from __future__ import annotations

import math

import numpy as np

from cbdp_jax._src.estimator.analytic import (
    SensitivityLike,
    _abs_sensitivity,
    _log1p_minus_x,
    _safe_expm1,
    _scalar_sensitivity,
    gaussian_kl,
    gaussian_renyi,
    laplace_renyi,
)
from cbdp_jax._src.infra.validation import check_positive

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
