"""Building the solver's problems from the public inputs: 1-D classes, polynomials, 2-D Laplace."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from cbdp_jax._src.exact import orthopoly
from cbdp_jax._src.exact.basis import _BasisRef, _poly_basis, _poly_half_width, _rebase_renyi
from cbdp_jax._src.exact.grids import _EXTENT, _KL_EXTENT, _Geometry1D, _Geometry2D
from cbdp_jax._src.exact.inputs import _Adversary, _call_features
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.exact.problem import _Problem
from cbdp_jax._src.privacy.divergences import get_divergence

_LIN_KL_MARGIN = (
    1e-5  # Laplace lin KL keeps |u| <= 1 - margin (accurate tails need (1-|u|) extent >> 1)
)


def _feasible_start(u: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    u = u.copy()
    for j in range(u.size):
        a, b = lo[j], hi[j]
        if np.isfinite(a) and np.isfinite(b):
            u[j] = np.clip(u[j], a + 0.1 * (b - a), b - 0.1 * (b - a))
        elif np.isfinite(b):
            u[j] = min(u[j], b - 0.05)
        elif np.isfinite(a):
            u[j] = max(u[j], a + 0.05)
    return u


def _starts(base: np.ndarray, scales: np.ndarray, lo, hi, n_starts: int) -> np.ndarray:
    rng = np.random.default_rng(20190)
    out = [_feasible_start(base, lo, hi)]
    for _ in range(n_starts - 1):
        out.append(_feasible_start(base + 0.3 * rng.standard_normal(base.size) / scales, lo, hi))
    return np.stack(out)


def _kind(name: str, convention: str) -> str:
    if name in ("renyi", "alpha"):
        return "renyi_abs" if convention == "abs" else "renyi_nonneg"
    return "dv" if name == "kl" else "fform"


def _bounded_starts(starts: np.ndarray, feats: Callable, name: str, delta: float) -> np.ndarray:
    """Bounded conjugate domain: shrinks each start until h < sup / 2 on a probe grid (h = 0 at 0)."""
    sup = get_divergence(name).conjugate_sup
    if math.isfinite(sup):
        probe = feats(np.linspace(-50.0, 50.0 + delta, 2001))
        for i in range(starts.shape[0]):
            top = float(np.max(probe @ starts[i]))
            if top > 0.5 * sup:
                starts[i] *= 0.5 * sup / top
    return starts


def _problem_1d(
    law: _Law1D,
    scale: float,
    name: str,
    adv: _Adversary,
    alpha: float | None,
    convention: str,
    n_starts: int,
    basis: orthopoly.OrthoPoly | None = None,
    warm: np.ndarray | None = None,
) -> _Problem:
    """One 1-D problem in standardised units z = x / scale (delta = shift / scale).

    Linear and polynomial classes go to :func:`_problem_poly`; a feature map is parametrised by its
    columns, each scaled to unit root mean square on a probe grid.
    """
    kind = _kind(name, convention)
    if adv.kind != "feature_map":
        return _problem_poly(law, scale, name, adv.degree, alpha, convention, n_starts, basis, warm)
    fn = adv.fn

    def feats(z: np.ndarray) -> np.ndarray:
        f = _call_features(fn, scale * np.asarray(z, dtype=np.float64))
        if kind == "fform":
            f = np.concatenate([np.ones((f.shape[0], 1)), f], axis=1)
        return f

    probe = feats(np.linspace(-4.0, 4.0 + law.delta, 41))
    col_scale = np.maximum(np.sqrt(np.mean(probe**2, axis=0)), 1e-3)
    m = probe.shape[1]
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    starts = _starts(np.zeros(m), col_scale, lo, hi, n_starts)
    if kind == "fform":
        starts = _bounded_starts(starts, feats, name, law.delta)
    a_exp = alpha / (alpha - 1.0) if alpha is not None else 0.0
    extent = _KL_EXTENT if kind == "dv" else _EXTENT
    geom = _Geometry1D(law, feats, extent)
    return _Problem(kind, name, alpha, a_exp, convention, geom, lo, hi, starts, lambda t: t.copy())


def _dv_bounds(law: _Law1D, poly: orthopoly.OrthoPoly, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The domain of E_Q[exp h] for h = sum_j u_j psi_j of degree k, in the coordinates u.

    psi_k has a positive leading coefficient lc_k, so the coefficient of z^k in h is u_k lc_k: it must
    be negative for an even k >= 2 (< 1/2 for the Gaussian at k = 2), and below 1 in absolute value
    for the Laplace linear class (docs/theory/exact_solver.md, section 3).
    """
    lo, hi = np.full(k, -np.inf), np.full(k, np.inf)
    lc = poly.leading_coefficients()[k]
    if k == 1 and law.tails == "laplace":
        lo[0], hi[0] = (-1.0 + _LIN_KL_MARGIN) / lc, (1.0 - _LIN_KL_MARGIN) / lc
    elif k == 2 and law.tails == "gaussian":
        hi[-1] = 0.5 / lc
    elif k >= 2:
        hi[-1] = 0.0
    return lo, hi


def _problem_poly(
    law: _Law1D,
    scale: float,
    name: str,
    degree: int,
    alpha: float | None,
    convention: str,
    n_starts: int,
    basis: orthopoly.OrthoPoly | None,
    warm: np.ndarray | None,
) -> _Problem:
    """A polynomial class of ``degree`` (1 = linear), parametrised by orthonormal polynomials.

    The basis starts orthonormal under (P + Q) / 2 (or is ``basis``, e.g. adapted to a lower degree's
    optimum) and, for the alpha family, is rebuilt between rounds orthonormal under the weight of the
    objective's Hessian at the current point (:func:`_rebase_renyi`), so Newton's linear algebra stays
    well conditioned at any degree float64 can represent (docs/theory/exact_solver.md, section 2).
    """
    kind = _kind(name, convention)
    k = degree
    dropped = kind == "dv" and k >= 3 and k % 2 == 1
    if dropped:
        k -= 1  # an odd leading coefficient makes E_Q[exp h] infinite: it must be 0
    ref = _BasisRef(_poly_basis(law, k) if basis is None else basis, k, False)
    ref.with_constant = kind == "fform"
    m = k + (1 if kind == "fform" else 0)
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    base = np.zeros(m)
    if kind == "dv":
        lo, hi = _dv_bounds(law, ref.poly, k)
        if k >= 2:
            base[-1] = -0.05
    starts = _starts(base, np.ones(m), lo, hi, n_starts)
    if warm is not None:
        # A lower degree's optimum, embedded (``[w, m]``; replaces the last w random starts).
        w = min(warm.shape[0], starts.shape[0] - 1)
        starts[starts.shape[0] - w :] = warm[:w]
    if kind == "fform":
        starts = _bounded_starts(starts, ref.features, name, law.delta)
    powers = np.arange(1, k + 1, dtype=np.float64)

    def to_theta(theta_z: np.ndarray) -> np.ndarray:
        # (constant, u_1..u_k) on psi_0..psi_k -> monomial coefficients in z -> in x = scale z.
        theta = ref.poly.monomial_matrix()[: k + 1, : k + 1] @ theta_z
        theta[1:] = theta[1:] / scale**powers
        return np.concatenate([theta, [0.0]]) if dropped else theta

    a_exp = alpha / (alpha - 1.0) if alpha is not None else 0.0
    # The long reach is for E_Q[exp(a z)] under Laplace noise with |a| near 1 (linear class only); an
    # even-degree h with a negative leading coefficient decays like a Gaussian or faster.
    extent = _KL_EXTENT if kind == "dv" and k == 1 else _EXTENT
    half_width = _poly_half_width(law.tails, k)
    geom = _Geometry1D(law, ref.features, extent, half_width, kind == "dv" and k >= 2)
    prob = _Problem(kind, name, alpha, a_exp, convention, geom, lo, hi, starts, to_theta)
    if kind.startswith("renyi"):
        prob.rebase = functools.partial(_rebase_renyi, prob, ref)
    prob.basis_ref = ref
    return prob


def _problem_2d_laplace(
    deltas: tuple[float, float], scale: float, name: str, alpha: float, convention: str
) -> _Problem:
    kind = "renyi_abs" if convention == "abs" else "renyi_nonneg"

    def to_theta(theta_z: np.ndarray) -> np.ndarray:
        return np.concatenate([[theta_z[0]], theta_z[1:] / scale])

    inf2 = np.full(2, np.inf)
    return _Problem(
        kind,
        name,
        alpha,
        alpha / (alpha - 1.0),
        convention,
        _Geometry2D(deltas),
        -inf2,
        inf2,
        np.zeros((1, 2)),
        to_theta,
    )
