"""Generalization (paper section 6) and Pinsker: bounds that follow from a restricted or plain KL.

Plain float functions of Python numbers, like :mod:`analytic`'s.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019.
  docs/theory/divergences.md, mechanisms.md and generalization.md.

"""

from __future__ import annotations

import math

from cbdp_jax._src.estimator.analytic import _check_nonneg_or_inf

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
