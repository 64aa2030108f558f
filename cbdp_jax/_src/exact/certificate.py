"""The value at the solver's optimum on a fresh grid, and its certificate.

Both forms (the solver's tight form and the plain f-form) are evaluated with normalised quadrature weights;
the certificate is the Newton decrement at the returned point (``GAP_TOL``) and the quadrature checks
(mass at the edge of the rule, a domain constraint active at the optimum); docs/theory/exact_solver.md.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.exact import quadrature as quad
from cbdp_jax._src.exact.float64 import _N_BUCKET, _exp
from cbdp_jax._src.exact.grids import _Grid
from cbdp_jax._src.exact.problem import _Problem
from cbdp_jax._src.privacy.divergences import Divergence, alpha_from_renyi, get_divergence

GAP_TOL = 1e-10  # converged needs newton_decrement^2 / 2 <= GAP_TOL (1 + |value|)


def _weighted(w: np.ndarray, values: Any) -> float:
    """sum(w * values) with zero-weight nodes contributing 0 even where values overflow."""
    values = np.asarray(values)
    return float(np.sum(np.where(w > 0, w * np.where(w > 0, values, 0.0), 0.0)))


def _conjugate(div: Divergence, h: np.ndarray) -> np.ndarray:
    """``div.conjugate`` on a padded copy of h (shapes reused across calls: no eager recompiles)."""
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(max(h.size, 1))))
    padded = np.zeros(n_pad)
    padded[: h.size] = h
    return np.asarray(div.conjugate(jnp.asarray(padded)))[: h.size]


def _conjugate_derivatives(div: Divergence, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and second derivatives of ``div.conjugate`` at h (elementwise, padded)."""
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(max(h.size, 1))))
    padded = jnp.asarray(np.pad(h, (0, n_pad - h.size)))
    d1 = jax.grad(div.conjugate)
    slope = jax.vmap(d1)(padded)
    bend = jax.vmap(jax.grad(d1))(padded)
    return np.asarray(slope)[: h.size], np.asarray(bend)[: h.size]


def _decrement(grad: np.ndarray, curv: np.ndarray) -> float:
    """sqrt(g^T C^-1 g): the Newton decrement, whose square / 2 estimates the remaining gap.

    Eigenvalues of C below 1e-12 of the largest are raised to that floor (a gradient along an almost
    flat direction then counts as a large possible gain, never as none).
    """
    if not (np.all(np.isfinite(grad)) and np.all(np.isfinite(curv))):
        return math.inf
    ev, vecs = np.linalg.eigh(0.5 * (curv + curv.T))
    top = float(np.max(np.abs(ev))) if ev.size else 0.0
    if top <= 0.0:
        return 0.0 if not np.any(grad) else math.inf
    proj = vecs.T @ grad
    lam2 = float(np.sum(proj**2 / np.maximum(ev, 1e-12 * top)))
    return math.sqrt(max(lam2, 0.0))


class _AtOptimum(NamedTuple):
    """Both forms at the solver's optimum on one grid, and the objective's slope and curvature there.

    ``grad`` and ``curv`` are in the solver's coordinates: the certificate's Newton decrement uses them.
    """

    value: float  # the tight form on the reported scale
    f_value: float  # the plain f-form
    theta_z: np.ndarray  # the plain f-form's parameters in standardised units
    h: np.ndarray  # the plain f-form's optimal h on the grid's nodes
    tail: float  # the share of the integrand on the edge panels of the rule
    grad: np.ndarray
    curv: np.ndarray
    reason: str | None = None


def _at_renyi(prob: _Problem, u: np.ndarray, grid: _Grid, wp, wq) -> _AtOptimum:
    """The alpha family: V = -log F, F = E_Q[|h|^A] with E_P[h] = 1, and the f-form at scale t*."""
    div = get_divergence("alpha", alpha=prob.alpha, convention=prob.convention)
    mu = wp @ grid.phi
    hm1 = (grid.phi - mu) @ u  # h - 1, E_P[h] = 1
    h_q = 1.0 + hm1
    base = np.abs(h_q) if prob.kind == "renyi_abs" else np.maximum(h_q, 0.0)
    big_a = prob.A
    reason = None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_base = np.where(hm1 > -0.5, np.log1p(np.maximum(hm1, -0.5)), np.log(base))
        terms = np.log(wq) + big_a * log_base
        excess = float(wq @ np.where(wq > 0, np.expm1(big_a * log_base), 0.0))  # F - 1
    # log F: log1p where F is near 1 (small values), logsumexp where it is far below (large ones)
    log_m = math.log1p(excess) if excess > -0.5 else quad.logsumexp(terms)
    tight_r = -log_m
    log_t = -(prob.alpha - 1.0) * log_m - math.log(prob.alpha - 1.0)  # log of the f-form's scale
    t_star = math.exp(min(log_t, 700.0))
    theta_z = t_star * np.concatenate([[1.0 - mu @ u], u])
    h_all = theta_z[0] + grid.phi @ theta_z[1:]
    with np.errstate(over="ignore", invalid="ignore"):
        f_value = float(wp @ h_all - _weighted(wq, _conjugate(div, h_all)))
    if log_t > 700.0 or not math.isfinite(f_value):
        f_value = float(alpha_from_renyi(tight_r, prob.alpha))
        reason = (
            "the plain f-form's optimal scale overflows float64: f_value from the scale-free "
            "form, theta scaled down to stay finite"
        )
    tail = float(np.sum(_exp(terms[grid.edge_mask] - log_m)))
    value = tight_r if prob.fname == "renyi" else float(alpha_from_renyi(tight_r, prob.alpha))
    # V = -log F, F = E_Q[|h|^A]: grad V = -A E_Q[|h|^(A-1) sign(h) (phi - mu)] / F and
    # -hess V ~ A (A - 1) E_Q[|h|^(A-2) (phi - mu)(phi - mu)^T] / F at the optimum.
    cen = grid.phi - mu
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = _exp(terms - log_m)  # w q |h|^A / F
        dterm = np.where(base > 0, rel / h_q, 0.0)
        d2term = np.where(base > 0, rel / np.maximum(h_q * h_q, 1e-200), 0.0)
    grad = -big_a * (cen.T @ dterm)
    curv = big_a * (big_a - 1.0) * (cen * d2term[:, None]).T @ cen
    return _AtOptimum(value, f_value, theta_z, h_all, tail, grad, curv, reason)


def _at_dv(u: np.ndarray, grid: _Grid, wp, wq) -> _AtOptimum:
    """KL: the Donsker-Varadhan form E_P[s] - log E_Q[exp s] and the f-form with b = 1 - log E_Q[exp s]."""
    s = grid.phi @ u
    centre = float(wp @ s)
    sc = s - centre
    live = wq > 0
    with np.errstate(over="ignore", invalid="ignore"):
        if np.max(np.abs(sc[live]), initial=0.0) <= 1.0:
            log_mc = math.log1p(float(wq[live] @ np.expm1(sc[live])))
        else:
            log_mc = quad.logsumexp(np.log(wq[live]) + sc[live])
    log_m = centre + log_mc
    b = 1.0 - log_m
    theta_z = np.concatenate([[b], u])
    h_all = b + s
    # f* = exp(s - 1) (docs/theory/divergences.md), summed as exp(log w q + h - 1): far-tail nodes have
    # w q = 0 while exp(h - 1) overflows, and 0 * inf must not turn the sum into NaN.
    with np.errstate(divide="ignore"):
        f_value = float(wp @ h_all - np.sum(_exp(np.log(wq) + h_all - 1.0)))
    value = -log_mc  # E_P[s] - log E_Q[exp s], with E_P[s - centre] = 0
    with np.errstate(divide="ignore"):
        tilted = _exp(np.log(wq) + s - log_m)
    tail = float(np.sum(tilted[grid.edge_mask]))
    m1 = tilted @ grid.phi
    grad = wp @ grid.phi - m1  # E_P[phi] - E_tilted[phi]
    curv = (grid.phi * tilted[:, None]).T @ grid.phi - np.outer(m1, m1)  # Cov_tilted(phi)
    return _AtOptimum(value, f_value, theta_z, h_all, tail, grad, curv)


def _at_fform(prob: _Problem, u: np.ndarray, grid: _Grid, wp, wq) -> _AtOptimum:
    """The plain f-form E_P[h] - E_Q[f*(h)] (chi^2, squared Hellinger, Jensen-Shannon)."""
    div = get_divergence(prob.fname)
    h_all = grid.phi @ u
    f_value = float(wp @ h_all - _weighted(wq, _conjugate(div, h_all)))
    tail = float(np.sum(wq[grid.edge_mask] * np.abs(h_all[grid.edge_mask]))) / max(
        float(wq @ np.abs(h_all)), 1e-300
    )
    slope, bend = _conjugate_derivatives(div, h_all)
    grad = wp @ grid.phi - (wq * np.where(wq > 0, slope, 0.0)) @ grid.phi
    curv = (grid.phi * (wq * np.where(wq > 0, bend, 0.0))[:, None]).T @ grid.phi
    return _AtOptimum(f_value, f_value, u, h_all, tail, grad, curv)


def _verdict(
    prob: _Problem, at: _AtOptimum, converged: bool, stable: bool
) -> tuple[bool, str | None, float, float]:
    """Whether the value is certified, why not, the gradient norm and the Newton decrement."""
    ok = converged and stable
    reason = at.reason
    value, h_all = at.value, at.h
    sup = get_divergence(prob.fname).conjugate_sup if prob.kind == "fform" else math.inf
    if not converged and math.isfinite(sup) and np.max(h_all) > sup - 1e-3:
        reason = (
            f"the domain constraint h(x) < {sup:.6g} is active at the optimum (max h = "
            f"{np.max(h_all):.6g}): the value is a feasible lower bound on the constrained supremum"
        )
    elif not converged:
        reason = "Newton did not reach the tolerance"
    elif not stable:
        reason = "the value still moved between quadrature refinements"
    if at.tail > 1e-9 and math.isfinite(value):
        ok = False
        reason = (
            f"{at.tail:.2g} of the integrand's mass lies at the edge of the quadrature range: "
            "E_Q[f*(h)] may be infinite near the optimum (an unbounded feature map?)"
        )
    if not math.isfinite(value) and reason is None:
        reason = "non-finite value at the optimum"
    grad_norm = float(np.linalg.norm(at.grad))
    decrement = _decrement(at.grad, at.curv)
    if not math.isfinite(grad_norm):
        grad_norm = math.inf
    if ok and decrement**2 / 2.0 > GAP_TOL * (1.0 + abs(value)):
        ok = False
        reason = (
            f"not certified: the Newton decrement {decrement:.3g} at the returned point leaves a "
            f"possible gap of ~{decrement**2 / 2:.3g} (tolerance {GAP_TOL:g} x (1 + |value|))"
        )
    return ok, reason, grad_norm, decrement


def _evaluate(
    prob: _Problem, u: np.ndarray, grid: _Grid, converged: bool, stable: bool, tol: float
) -> dict[str, Any]:
    """Plain f-form and tight form at the optimum, on the final grid, plus the quadrature checks.

    Both are computed with the rule's P and Q weights normalised to mass 1 (the rule misses ~1e-15 of
    each) and the tight form with log1p / expm1 around h = 1 (alpha family) or h = E_P h (KL), so a
    value of 1e-7 keeps ~1e-14 relative accuracy; ``value`` is the tight form (equal to the f-form at
    the optimum, and computed with less cancellation), ``f_value`` the plain f-form.
    """
    wp, wq = _exp(grid.lwp), _exp(grid.lwq)
    wp, wq = wp / wp.sum(), wq / wq.sum()
    if prob.kind.startswith("renyi"):
        at = _at_renyi(prob, u, grid, wp, wq)
    elif prob.kind == "dv":
        at = _at_dv(u, grid, wp, wq)
    else:
        at = _at_fform(prob, u, grid, wp, wq)
    ok, reason, grad_norm, decrement = _verdict(prob, at, converged, stable)
    return {
        "value": at.value,
        "f_value": at.f_value,
        "tight_value": at.value,
        "theta": prob.to_theta(np.asarray(at.theta_z, dtype=np.float64)),
        "converged": ok,
        "reason": reason,
        "u": np.asarray(u, dtype=np.float64),
        "gradient_norm": grad_norm,
        "newton_decrement": decrement,
        "problem": prob,
        "grid": grid,
        "h": at.h,  # the plain f-form's optimal h on the grid's nodes
    }
