"""The batched damped Newton solver (JAX) and the grid-refinement rounds around it.

A :class:`_Problem` is one concave maximisation written as a convex minimisation F(u); lanes (problem,
start) are padded to common sizes and solved by one vmapped ``lax.while_loop`` per round
(docs/theory/exact_solver.md).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cbdp_jax._src.exact.certificate import _evaluate
from cbdp_jax._src.exact.float64 import _N_BUCKET
from cbdp_jax._src.exact.grids import _Grid
from cbdp_jax._src.exact.problem import _Problem
from cbdp_jax._src.privacy.divergences import alpha_from_renyi, get_divergence

_MAX_ROUNDS = 8  # grid-refinement rounds (roots of h and integrand modes move with theta)
_MAX_ITER = 100  # Newton iterations per round
_ROUND0_ITER = 25  # Newton iterations on the first (unsplit) grid
_M_PAD = 4  # parameter vectors are padded to this length (one compilation for lin, poly_2, poly_3)


def _objective(kind: str, fname: str | None, phi, lw, mu, a_exp, u):
    if kind == "renyi_abs":
        h = 1.0 + phi @ u
        base = jnp.maximum(jnp.abs(h), 1e-300)
        return jnp.sum(jnp.exp(lw + a_exp * jnp.log(base)))
    if kind == "renyi_nonneg":
        h = 1.0 + phi @ u
        pos = h > 0
        base = jnp.where(pos, h, 1.0)
        return jnp.sum(jnp.where(pos, jnp.exp(lw + a_exp * jnp.log(base)), 0.0))
    if kind == "dv":
        return jax.scipy.special.logsumexp(lw + phi @ u) - mu @ u
    conj = get_divergence(fname).conjugate
    valid = jnp.isfinite(lw)
    h = jnp.where(valid, phi @ u, 0.0)
    return -(mu @ u - jnp.sum(jnp.where(valid, jnp.exp(lw) * conj(h), 0.0)))


_EDGE_LOG_MASS = math.log(1e-12)  # DV: the tilted law may put at most this much on the edge panels


def _feasible(kind: str, fname: str | None, phi, lw, lo, hi, edge, guard_phi, guard_lw, u):
    """Whether u lies in the (numerical) domain of the objective.

    For KL the true domain of E_Q[exp h] is open and its boundary is where h stops decaying in the
    tails; a truncated quadrature rule cannot see the blow-up there, so a point whose tilted law
    exp(h) q / E_Q[exp h] puts more than 1e-12 of its mass on the outermost panels counts as outside
    (docs/theory/exact_solver.md, section 3).
    """
    ok = jnp.all((u > lo) & (u < hi))
    if kind == "dv":
        s = lw + phi @ u
        lse = jax.scipy.special.logsumexp
        total = lse(s)
        ok = ok & (lse(jnp.where(edge, s, -jnp.inf)) - total < _EDGE_LOG_MASS)
        ok = ok & (jnp.max(guard_lw + guard_phi @ u) - total < _EDGE_LOG_MASS)
    if kind == "fform":
        sup = get_divergence(fname).conjugate_sup
        if math.isfinite(sup):
            valid = jnp.isfinite(lw)
            ok = ok & jnp.all(jnp.where(valid, phi @ u < sup, True))
    return ok


def _derivatives(kind: str, fname: str | None, phi, lw, mu, a_exp, u):
    """The gradient and Hessian of the objective.

    Closed forms for the alpha family and DV (a smaller program to compile than nested autodiff);
    autodiff for the plain f-forms.
    """
    if kind in ("renyi_abs", "renyi_nonneg"):
        h = 1.0 + phi @ u
        if kind == "renyi_abs":
            base = jnp.maximum(jnp.abs(h), 1e-300)
            t = jnp.exp(lw + a_exp * jnp.log(base))  # w q |h|^A
        else:
            pos = h > 0
            t = jnp.where(pos, jnp.exp(lw + a_exp * jnp.log(jnp.where(pos, h, 1.0))), 0.0)
        h_safe = jnp.where(jnp.abs(h) < 1e-100, 1e-100, h)  # h^2 must not underflow to 0
        g = a_exp * phi.T @ (t / h_safe)
        hm = a_exp * (a_exp - 1.0) * (phi * (t / h_safe**2)[:, None]).T @ phi
        return g, hm
    if kind == "dv":
        s = lw + phi @ u
        pi = jnp.exp(s - jax.scipy.special.logsumexp(s))  # the tilted law exp(h) q / E_Q[exp h]
        m1 = phi.T @ pi
        return m1 - mu, (phi * pi[:, None]).T @ phi - jnp.outer(m1, m1)

    def obj(v):
        return _objective(kind, fname, phi, lw, mu, a_exp, v)

    return jax.grad(obj)(u), jax.hessian(obj)(u)


def _newton_lane(
    kind, fname, max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
):
    """Damped Newton with backtracking from one start; returns (u, F(u), converged, iterations).

    ``active`` marks the real parameters; padded ones (zero features) get a unit Hessian entry and
    never move.
    """

    def safe_f(u):
        val = _objective(kind, fname, phi, lw, mu, a_exp, u)
        feasible = _feasible(kind, fname, phi, lw, lo, hi, edge, guard_phi, guard_lw, u)
        ok = feasible & jnp.isfinite(val)
        return jnp.where(ok, val, jnp.inf)

    f0 = safe_f(u0)
    init = (u0, f0, jnp.int32(0), ~jnp.isfinite(f0), jnp.array(False))

    def cond(state):
        _, _, it, done, _ = state
        return (~done) & (it < max_iter)

    def body(state):
        u, f, it, _, _ = state
        g, hm = _derivatives(kind, fname, phi, lw, mu, a_exp, u)
        g = jnp.where(active, g, 0.0)
        hm = 0.5 * (hm + hm.T) * jnp.outer(active, active) + jnp.diag(jnp.where(active, 0.0, 1.0))
        ev, vecs = jnp.linalg.eigh(hm)
        top = jnp.max(jnp.abs(ev))
        ev = jnp.maximum(ev, 1e-12 * top + 1e-300)  # damped: positive definite, no ascent direction
        d = jnp.where(active, -(vecs @ ((vecs.T @ g) / ev)), 0.0)
        dec = -(g @ d)  # Newton decrement squared; F(u) - F* ~ dec / 2 near the optimum
        thresh = tol * jnp.abs(f) + 1e-15
        small = 0.5 * dec <= thresh

        def ls_cond(c):
            t, ft, k = c
            return (~(ft <= f - 1e-4 * t * dec)) & (k < 60)

        def ls_body(c):
            t, _, k = c
            t = 0.5 * t
            return t, safe_f(u + t * d), k + 1

        t, ft, _ = lax.while_loop(ls_cond, ls_body, (1.0, safe_f(u + d), 0))
        better = ft < f
        u_new = jnp.where(better, u + t * d, u)
        f_new = jnp.where(better, ft, f)
        stalled_ok = (~better) & (0.5 * dec <= 1e3 * thresh)
        return u_new, f_new, it + 1, small | ~better, small | stalled_ok

    u, f, it, _, conv = lax.while_loop(cond, body, init)
    return u, f, conv, it


@functools.partial(jax.jit, static_argnames=("kind", "fname"))
def _solve_lanes(
    kind, fname, max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
):
    """Vmapped Newton over lanes (one problem and one start each): [L, ...] -> u [L, m], F, conv, it."""
    lane = functools.partial(_newton_lane, kind, fname)
    axes = (None, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, None, 0)
    return jax.vmap(lane, in_axes=axes)(
        max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
    )


def _pack(problems: list[_Problem], grids: list[_Grid], starts: list[np.ndarray]):
    """Lanes = (problem, start) pairs, node counts padded to a power of two and lanes likewise."""
    n_max = max(g.lwq.size for g in grids)
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(n_max)))
    m_real = problems[0].starts.shape[1]
    # One compilation serves every class with up to _M_PAD parameters, then one per power of two.
    m = max(_M_PAD, 2 ** math.ceil(math.log2(m_real)))
    starts = [np.pad(st, ((0, 0), (0, m - m_real))) for st in starts]
    owner = np.concatenate([np.full(st.shape[0], i) for i, st in enumerate(starts)])
    n_lanes = 2 ** math.ceil(math.log2(owner.size))
    owner = np.concatenate([owner, np.full(n_lanes - owner.size, owner[-1])])
    u0 = np.concatenate(starts + [np.repeat(starts[-1][-1:], n_lanes - sum(map(len, starts)), 0)])
    b = len(problems)
    phi = np.zeros((b, n_pad, m))
    lw = np.full((b, n_pad), -np.inf)
    mu = np.zeros((b, m))
    edge = np.zeros((b, n_pad), dtype=bool)
    for i, (p, g) in enumerate(zip(problems, grids, strict=True)):
        ph, lq, mp = p.solver_data(g)
        phi[i, : lq.size, :m_real] = ph
        lw[i, : lq.size] = lq
        mu[i, :m_real] = mp
        edge[i, : lq.size] = g.edge_mask
    n_guard = max((0 if g.guard_lw is None else g.guard_lw.size) for g in grids)
    g_pad = 2 ** math.ceil(math.log2(max(n_guard, 1)))
    guard_phi = np.zeros((b, g_pad, m))
    guard_lw = np.full((b, g_pad), -np.inf)
    for i, g in enumerate(grids):
        if g.guard_lw is not None and g.guard_lw.size:
            guard_phi[i, : g.guard_lw.size, :m_real] = g.guard_phi
            guard_lw[i, : g.guard_lw.size] = g.guard_lw
    a_exp = np.array([p.A for p in problems])
    pad = (0, m - m_real)
    lo = np.stack([np.pad(p.lo, pad, constant_values=-np.inf) for p in problems])
    hi = np.stack([np.pad(p.hi, pad, constant_values=np.inf) for p in problems])
    lanes = tuple(x[owner] for x in (phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw))
    return lanes, u0, owner, np.arange(m) < m_real


def _run_solver(
    problems: list[_Problem],
    grids: list[_Grid],
    starts: list[np.ndarray],
    tol: float,
    max_iter: int = _MAX_ITER,
):
    kind = problems[0].kind
    fname = problems[0].fname if kind == "fform" else None
    lanes, u0, owner, active = _pack(problems, grids, starts)
    u, f, conv, _ = _solve_lanes(
        kind,
        fname,
        jnp.int32(max_iter),
        *map(jnp.asarray, lanes),
        jnp.asarray(active),
        jnp.float64(tol),
        jnp.asarray(u0),
    )
    u, f, conv = np.asarray(u)[:, : active.sum()], np.asarray(f), np.asarray(conv)
    f = np.where(np.isfinite(f), f, np.inf)
    best_u, best_f, best_c = [], [], []
    for i in range(len(problems)):
        idx = np.nonzero(owner == i)[0]
        j = idx[int(np.argmin(f[idx]))]
        best_u.append(u[j])
        best_f.append(f[j])
        best_c.append(conv[j])
    return np.stack(best_u), np.array(best_f), np.array(best_c)


def _tight_value(prob: _Problem, f_min: float) -> float:
    """The solver's optimum on the reported scale."""
    if prob.kind.startswith("renyi"):
        r = -math.log(f_min) if f_min > 0 else math.inf
        return r if prob.fname == "renyi" else float(alpha_from_renyi(r, prob.alpha))
    return -f_min


def _solve_problems(problems: list[_Problem], tol: float) -> list[dict[str, Any]]:
    """Grid-refinement rounds around the batched Newton solver; final evaluation on a fresh grid."""
    grids = [p.geometry.initial_grid() for p in problems]
    # Round 0 only has to locate the roots of h (its grid is not split there, so Newton is erratic
    # near convergence): a loose tolerance and a short budget; later rounds polish on split grids.
    u, f, conv = _run_solver(
        problems, grids, [p.starts for p in problems], max(tol, 1e-6), _ROUND0_ITER
    )
    prev = np.array([_tight_value(p, fi) for p, fi in zip(problems, f, strict=True)])
    stable = np.zeros(len(problems), dtype=bool)
    for _ in range(_MAX_ROUNDS):
        grids = [
            p.geometry.refined_grid(p, ui, g) for p, ui, g in zip(problems, u, grids, strict=True)
        ]
        for i, p in enumerate(problems):
            if p.rebase is not None:
                u[i], grids[i] = p.rebase(u[i], grids[i])
        # Warm start from the best point only (one lane per problem: the starts have done their job).
        warm = [ui[None, :] for ui in u]
        u, f, conv = _run_solver(problems, grids, warm, tol)
        vals = np.array([_tight_value(p, fi) for p, fi in zip(problems, f, strict=True)])
        stable = np.abs(vals - prev) <= 10.0 * tol * np.abs(vals) + 1e-13
        prev = vals
        if np.all(stable | ~np.isfinite(vals)):
            break
    out = []
    for p, ui, g, ci, si in zip(problems, u, grids, conv, stable, strict=True):
        final = p.geometry.refined_grid(p, ui, g)
        out.append(_evaluate(p, ui, final, bool(ci), bool(si), tol))
    return out
