"""The result of an exact computation: :class:`ExactResult` and how the solver's output becomes one."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from cbdp_jax._src.exact.inputs import _Adversary
from cbdp_jax._src.exact.pairs import NoisePair
from cbdp_jax._src.privacy.divergences import renyi_from_alpha


class ExactResult(NamedTuple):
    """An exact (quadrature) divergence value with its optimiser and the inputs that produced it.

    Attributes:
      value: The divergence on the reported scale (Renyi for ``'renyi'``): the solver's tight form at
        the optimum (equal to the plain f-form there, computed with less cancellation). ``+inf`` for
        separable pairs, never NaN.
      f_value: The plain f-form at the optimum on the f-divergence scale (the alpha-divergence for
        ``'renyi'``).
      theta: The optimal parameters in the original units, ``theta[0]`` the constant, then one
        coefficient per feature (linear: a_1..a_d; poly: the coefficients of x, x^2, ..., x^k; a feature
        map: its columns), for the plain f-form. Empty where no optimum exists (``+inf``, unrestricted).
      converged: Whether the solver met its tolerance and the quadrature checks passed.
      reason: Why the value is +inf or 0 by a structural argument, or why ``converged`` is False; None
        otherwise.
      tight_value: The value of the solver's tighter form (Donsker-Varadhan / scale-free Renyi) on the
        reported scale; equals ``value`` at the optimum.
      pair: The pair of laws.
      divergence: The divergence name.
      adversary: ``'linear'``, ``'poly'``, ``'feature_map'`` or ``'unrestricted'``.
      degree: The polynomial degree (1 for linear, None for a feature map or unrestricted).
      alpha: The order for ``'renyi'`` / ``'alpha'``, else None.
      convention: The alpha-divergence convention (``'abs'`` or ``'nonneg'``).
      gradient_norm: The Euclidean norm of the gradient of the solver's objective (Renyi scale for the
        alpha family, Donsker-Varadhan for KL, the f-form otherwise) at the returned optimum, in the
        coordinates the solver ends in -- for linear and polynomial classes polynomials orthonormal
        under (P + Q) / 2 (KL, chi^2) or under the weight of the objective's Hessian (alpha family).
        0.0 where the value is exact by a structural argument; None where no solve ran.
      newton_decrement: The certificate's first part: sqrt(g^T C^+ g) with g that gradient and C the
        objective's curvature there; decrement^2 / 2 estimates how far the value can still be below
        the supremum. ``converged`` requires decrement^2 / 2 <= ``GAP_TOL`` (1 + |value|) (and a
        finite decrement: no gradient along a direction without curvature). Same None / 0.0 cases.
      monotone_checked: The certificate's second part (polynomial and linear classes): True when the
        value was checked to be >= ``previous_value`` - 1e-9 (1 + |previous_value|); the classes nest,
        so a smaller value would prove the solve wrong (``converged`` is then False). False where no
        comparison applies (feature maps, d > 1, structural values, unrestricted).
      previous_value: The value of the next smaller class it was compared with (degree k - 1; for KL
        the previous even degree, or linear; 0 for the constants below degree 1), else None.

    """

    value: float
    f_value: float
    theta: np.ndarray
    converged: bool
    reason: str | None
    tight_value: float
    pair: NoisePair
    divergence: str
    adversary: str
    degree: int | None
    alpha: float | None
    convention: str
    gradient_norm: float | None = None
    newton_decrement: float | None = None
    monotone_checked: bool = False
    previous_value: float | None = None

    def __float__(self) -> float:
        """``float(result)`` is ``result.value`` (the reported-scale divergence)."""
        return float(self.value)


def _result(
    pair: NoisePair,
    name: str,
    adv: _Adversary,
    alpha: float | None,
    convention: str,
    *,
    f_value: float,
    theta: np.ndarray,
    converged: bool,
    reason: str | None,
    value: float | None = None,
    tight_value: float | None = None,
    gradient_norm: float | None = None,
    newton_decrement: float | None = None,
    monotone_checked: bool = False,
    previous_value: float | None = None,
) -> ExactResult:
    if value is None:
        value = float(renyi_from_alpha(f_value, alpha)) if name == "renyi" else float(f_value)
    return ExactResult(
        float(value),
        float(f_value),
        np.asarray(theta, dtype=np.float64),
        bool(converged),
        reason,
        float(value if tight_value is None else tight_value),
        pair,
        name,
        adv.kind,
        adv.degree,
        alpha,
        convention,
        None if gradient_norm is None else float(gradient_norm),
        None if newton_decrement is None else float(newton_decrement),
        bool(monotone_checked),
        None if previous_value is None else float(previous_value),
    )


def _from_solution(pair, name, adv, alpha, convention, s: dict[str, Any]) -> ExactResult:
    return _result(
        pair,
        name,
        adv,
        alpha,
        convention,
        f_value=s["f_value"],
        theta=s["theta"],
        converged=s["converged"],
        reason=s["reason"],
        value=s["value"],
        tight_value=s["tight_value"],
        gradient_norm=s.get("gradient_norm"),
        newton_decrement=s.get("newton_decrement"),
        monotone_checked=s.get("monotone_checked", False),
        previous_value=s.get("previous_value"),
    )
