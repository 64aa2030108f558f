"""Quadrature geometries: where the nodes are, and the solver's features on them (1-D and 2-D Laplace)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from cbdp_jax._src.exact import quadrature as quad
from cbdp_jax._src.exact.float64 import _log_weights
from cbdp_jax._src.exact.laws import _Law1D

_KL_EXTENT = 2.0**24  # tail reach (scale units) for KL: E_Q[exp(a x)] decays like exp(-(1 - |u|) z)
_EXTENT = 512.0  # tail reach for everything else: integrands decay at least like exp(-z)


class _Grid(NamedTuple):
    """Quadrature nodes with log weights under P and Q and the solver's features on them."""

    z: np.ndarray  # [N] (1-D) or [N, 2] (2-D), standardised units
    lwp: np.ndarray  # [N] log(weight * p)
    lwq: np.ndarray  # [N] log(weight * q)
    phi: np.ndarray  # [N, m] features (solver units)
    edge_mask: np.ndarray  # [N] nodes in the outermost tail panels (tail-mass check)
    guard_lw: np.ndarray | None = (
        None  # [G] pseudo log weights of probe points beyond the rule (KL)
    )
    guard_phi: np.ndarray | None = None  # [G, m] features at the probe points
    guard_z: np.ndarray | None = None  # [G] the probe points

    def with_features(self, features: Callable[[np.ndarray], np.ndarray]) -> _Grid:
        """The same nodes and weights with the features recomputed (after a change of basis)."""
        guard_phi = None if self.guard_z is None else features(self.guard_z)
        return self._replace(phi=features(self.z), guard_phi=guard_phi)


class _ProblemView(Protocol):
    """What a geometry's ``refined_grid`` reads of a problem (:class:`~cbdp_jax._src.exact.problem._Problem`).

    A protocol, so that the geometries sit below the problem type and import nothing above them.
    """

    kind: str
    A: float

    def mu_p(self, grid: _Grid) -> np.ndarray: ...


@dataclasses.dataclass
class _Geometry1D:
    """A 1-D pair in standardised units (P, Q from a :class:`_Law1D`), features phi(z) -> [n, m]."""

    law: _Law1D
    features: Callable[[np.ndarray], np.ndarray]
    extent: float
    half_width: float = 12.0  # uniform panels this far around each centre (grows with the degree)
    guard: bool = False  # KL with a polynomial of degree >= 2: probe the far tails (see _guard)

    @property
    def delta(self) -> float:
        return self.law.delta

    def grid(self, roots: Sequence[float] = (), centres: Sequence[float] = ()) -> _Grid:
        z, w = quad.rule_1d(
            [*self.law.grid_centres, *centres],
            self.law.kinks,
            roots,
            extent=self.extent,
            width=0.5,
            half_width=self.half_width,
        )
        lo, hi = z[0], z[-1]
        span = max(1.0, 0.05 * self.extent)
        edge = (z < lo + span) | (z > hi - span)
        guard_lw = guard_phi = guard_z = None
        if self.guard:
            guard_z, guard_lw, guard_phi = self._guard(lo, hi)
        return _Grid(
            z,
            _log_weights(w, self.law.log_p(z)),
            _log_weights(w, self.law.log_q(z)),
            self.features(z),
            edge,
            guard_lw,
            guard_phi,
            guard_z,
        )

    def _guard(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Probe points beyond the rule's range, where E_Q[exp h] could still blow up unseen.

        A polynomial h with a tiny negative leading coefficient can rise far beyond the last node
        before it turns down; the rule then reports a finite E_Q[exp h] although the true one is
        astronomically large. The probes sit at geometric distances (ratio 1.25) out to where the
        features would overflow, each with pseudo log weight log q(z) + log(0.25 |z|) (the width of
        a panel there); the solver treats a point whose exp(h) q exceeds 1e-12 of E_Q[exp h] at any
        probe as outside the domain (docs/theory/exact_solver.md, section 3).
        """
        reach = max(abs(lo), abs(hi))
        probe = self.features(np.array([reach]))
        k = max(probe.shape[1], 1)
        far = min(1e12, reach * math.exp(min(600.0 / k, 60.0)))
        n = max(1, int(math.log(far / reach) / math.log(1.25)))
        r = reach * 1.25 ** np.arange(1, n + 1)
        z = np.concatenate([-r, r])
        lq = self.law.log_q(z) + np.log(0.25 * np.abs(z))
        with np.errstate(over="ignore", invalid="ignore"):
            phi = self.features(z)
        ok = np.all(np.isfinite(phi), axis=1)
        return z[ok], lq[ok], phi[ok]

    def initial_grid(self) -> _Grid:
        return self.grid()

    def refined_grid(self, prob: _ProblemView, u: np.ndarray, grid: _Grid) -> _Grid:
        """A grid split at the roots of h (alpha family) and centred also on the integrand's mode."""
        log_q = self.law.log_q(grid.z)
        roots: np.ndarray = np.zeros(0)
        if prob.kind.startswith("renyi"):
            mu = prob.mu_p(grid)

            def h_fn(z: np.ndarray) -> np.ndarray:
                return 1.0 + (self.features(z) - mu) @ u

            hz = h_fn(grid.z)
            with np.errstate(divide="ignore"):
                score = log_q + prob.A * np.log(np.abs(hz))
            roots = _relevant_roots(grid.z, score, quad.sign_change_roots(grid.z, hz, h_fn))
        elif prob.kind == "dv":
            score = log_q + grid.phi @ u
        else:
            return self.grid()
        mode = float(grid.z[int(np.argmax(score))])
        return self.grid(roots, [mode])


def _relevant_roots(z: np.ndarray, score: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Roots of h where the integrand is not negligible (within exp(-46) of its peak nearby).

    Splitting at a root only pays where the integrand has mass; roots in the far tails (or near 1e14
    for a tiny leading coefficient, docs/theory/mechanisms.md pitfall) would only add nodes.
    """
    if roots.size == 0:
        return roots
    top = np.max(score)
    lo = np.searchsorted(z, roots - 1.0)
    hi = np.searchsorted(z, roots + 1.0)
    keep = np.array(
        [hi_ > lo_ and np.max(score[lo_:hi_]) > top - 46.0 for lo_, hi_ in zip(lo, hi, strict=True)]
    )
    return roots[keep]


@dataclasses.dataclass
class _Geometry2D:
    """A 2-D Laplace pair (both coordinates shifted) for the linear class, nested quadrature.

    The root set of h = 1 + u.(z - mu) is a line. With k the coordinate of largest |u_k| (inner) and o the
    other (outer), for each outer node z_o the inner 1-D rule is split at the root
    z_k = mu_k - (1 + u_o (z_o - mu_o)) / u_k; the outer rule is split where that root crosses the inner
    density kinks (0 and delta_k), where the inner integral is less smooth.
    """

    deltas: tuple[float, float]
    extent: float = 64.0  # |h|^A Laplace tails: exp(-z) times a power of z; 64 units is e^-64
    n: int = 6  # Gauss-Legendre points per panel (2-D needs far fewer nodes than 1-D: agreement
    grade: int = 10  # with an independent 1-D reduction is ~1e-12 at these settings, see the tests)

    def _rule(self, coord: int, roots: Sequence[float] = (), grade: int = 8):
        d = self.deltas[coord]
        return quad.rule_1d(
            [0.0, d], [0.0, d], roots, extent=self.extent, width=1.0, n=self.n, grade=grade
        )

    def _assemble(self, z: np.ndarray, w: np.ndarray) -> _Grid:
        d = np.asarray(self.deltas)
        lp = quad.log_density("laplace", z, 0.0).sum(axis=1)
        lq = quad.log_density("laplace", z - d[None, :], 0.0).sum(axis=1)
        reach = np.max(np.abs(z - 0.5 * d[None, :]), axis=1)
        edge = reach > reach.max() - max(1.0, 0.05 * self.extent)
        return _Grid(z, _log_weights(w, lp), _log_weights(w, lq), z.copy(), edge)

    def initial_grid(self) -> _Grid:
        z1, w1 = self._rule(0)
        z2, w2 = self._rule(1)
        z = np.stack(np.meshgrid(z1, z2, indexing="ij"), axis=-1).reshape(-1, 2)
        w = np.outer(w1, w2).ravel()
        return self._assemble(z, w)

    def refined_grid(self, prob: _ProblemView, u: np.ndarray, grid: _Grid) -> _Grid:
        k = int(np.argmax(np.abs(u)))
        o = 1 - k
        if abs(u[k]) < 1e-300:
            return self.initial_grid()
        mu = prob.mu_p(grid)
        special: list[float] = []
        if abs(u[o]) > 0.0:
            for c in (0.0, self.deltas[k]):
                special.append(mu[o] - (1.0 + u[k] * (c - mu[k])) / u[o])
        zo, wo = self._rule(o, special)
        base = quad.base_edges(
            [0.0, self.deltas[k]],
            [0.0, self.deltas[k]],
            half_width=12.0,
            width=1.0,
            extent=self.extent,
        )
        roots = mu[k] - (1.0 + u[o] * (zo - mu[o])) / u[k]
        roots = np.clip(roots, base[0], base[-1])
        graded = quad.graded_edges(roots, width=1.0, levels=self.grade).reshape(roots.size, -1)
        edges = np.sort(np.concatenate([np.broadcast_to(base, (zo.size, base.size)), graded], 1), 1)
        edges = np.clip(edges, base[0], base[-1])
        zk, wk = quad.rule_from_edges(edges, self.n)  # [n_o, K * n]
        z = np.empty((zk.size, 2))
        z[:, k] = zk.ravel()
        z[:, o] = np.repeat(zo, zk.shape[1])
        w = (wo[:, None] * wk).ravel()
        keep = w > 0
        return self._assemble(z[keep], w[keep])
