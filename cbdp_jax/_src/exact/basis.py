"""Orthonormal polynomial bases of the polynomial classes, and their change between rounds.

The basis starts orthonormal under (P + Q) / 2; for the alpha family it is rebuilt between rounds
orthonormal under the weight of the objective's Hessian (docs/theory/exact_solver.md, section 2).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from cbdp_jax._src.exact import orthopoly
from cbdp_jax._src.exact import quadrature as quad
from cbdp_jax._src.exact.float64 import _exp
from cbdp_jax._src.exact.grids import _EXTENT, _Grid
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.exact.problem import _Problem


def _poly_half_width(tails: str, degree: int) -> float:
    """Half-width (standardised units) of the uniformly resolved region for polynomials of ``degree``.

    An orthonormal polynomial of degree n under exp(-|z|) oscillates out to about (pi / 2) n, under
    exp(-z^2 / 2) out to about 2 sqrt(n) (Mhaskar-Rakhmanov-Saff numbers); the integrands the solver
    forms have degree up to 2k, so the resolved region covers those reaches for n = 2k, plus the
    12 units every rule here starts with (docs/theory/exact_solver.md, section 2).
    """
    reach = math.pi * degree if tails == "laplace" else 2.0 * math.sqrt(2.0 * degree)
    return 12.0 + reach


@functools.lru_cache(maxsize=64)
def _reference_rule(law: _Law1D, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and normalised weights of (P + Q) / 2 (standardised units)."""
    z, w = quad.rule_1d(
        law.grid_centres,
        law.kinks,
        extent=_EXTENT,
        width=0.5,
        half_width=_poly_half_width(law.tails, degree),
    )
    w = w * 0.5 * (_exp(law.log_p(z)) + _exp(law.log_q(z)))
    return z, w / w.sum()


@functools.lru_cache(maxsize=64)
def _poly_basis(law: _Law1D, degree: int) -> orthopoly.OrthoPoly:
    """psi_0..psi_degree orthonormal under (P + Q) / 2 (standardised units)."""
    z, w = _reference_rule(law, degree)
    return orthopoly.stieltjes(z, w, degree, shift=float(w @ z))


class _BasisRef:
    """The current orthonormal basis of one polynomial problem (it changes between rounds)."""

    def __init__(self, poly: orthopoly.OrthoPoly, degree: int, with_constant: bool):
        self.poly = poly
        self.degree = degree
        self.with_constant = with_constant

    def features(self, z: np.ndarray) -> np.ndarray:
        vals = self.poly(z, self.degree)
        return vals if self.with_constant else vals[:, 1:]


def _rebase_renyi(
    prob: _Problem, ref: _BasisRef, u: np.ndarray, grid: _Grid
) -> tuple[np.ndarray, _Grid]:
    """Re-expresses h in polynomials orthonormal under the Hessian weight q |h|^(A - 2) at u.

    The Hessian of E_Q[|h|^A] is A (A - 1) E_Q[|h|^(A-2) (psi - mu)(psi - mu)^T]; in a basis orthonormal
    under (a regularised) q |h|^(A-2) it is close to a multiple of the identity, whatever the noise
    geometry and the order. The class is unchanged (same span); u is mapped exactly by the discrete
    inner products T = <psi_new, psi_old> under that weight. The new basis is kept only if it
    reproduces h on the nodes and does not worsen the objective.
    """
    k = ref.degree
    old = ref.poly(grid.z, k)
    wq = _exp(grid.lwq)
    mu = _exp(grid.lwp) @ old[:, 1:]
    h = 1.0 + (old[:, 1:] - mu) @ u
    floor = 1e-6 * math.sqrt(max(float(wq @ (h * h)), 1e-300))
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        lw = grid.lwq + (prob.A - 2.0) * np.log(np.maximum(np.abs(h), floor))
    lw = np.where(np.isfinite(lw), lw, -np.inf)
    weight = _exp(lw - np.max(lw))
    weight = weight / weight.sum()
    ref_w = 0.5 * (wq + _exp(grid.lwp))
    weight = weight + 1e-8 * ref_w / ref_w.sum()  # keeps every degree supported
    weight = weight / weight.sum()
    centre = float(weight @ grid.z)
    width = math.sqrt(max(float(weight @ (grid.z - centre) ** 2), 1e-12))
    try:
        poly = orthopoly.stieltjes(grid.z, weight, k, shift=centre, width=width)
    except ValueError:
        return u, grid
    new = poly(grid.z, k)
    if not np.all(np.isfinite(new)):
        return u, grid
    t = new.T @ (weight[:, None] * old)
    u_new = t[1:, 1:] @ u
    mu_new = _exp(grid.lwp) @ new[:, 1:]
    h_new = 1.0 + (new[:, 1:] - mu_new) @ u_new
    f_old = float(wq @ np.abs(h) ** prob.A)
    f_new = float(wq @ np.abs(h_new) ** prob.A)
    if not (math.isfinite(f_new) and f_new <= f_old * (1.0 + 1e-12)):
        return u, grid
    ref.poly = poly
    return u_new, grid.with_features(ref.features)
