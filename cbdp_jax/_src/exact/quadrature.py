"""Deterministic float64 quadrature on the real line for the exact layer (private).

Every integral the exact layer needs is E_P[g] or E_Q[g] for a Laplace or Gaussian law on R (or a product
of two), with g smooth except at a few known points: the density kinks (Laplace: its centre), the roots of
an adversary h (|h|^A has a kink there) and the crossing point of two densities (total variation). The
rule used everywhere is composite Gauss-Legendre on panels whose edges include every such point, so each
panel sees an analytic integrand:

* uniform panels of width ``width`` over ``centre +- half_width`` for each centre (density modes and the
  mode of the integrand);
* geometric panels (widths ``width * 2^j``) filling the gaps between those regions and the two tails out
  to ``extent`` beyond the last one. A geometric tail integrates exp(-kappa z) to full precision for any
  kappa with ``kappa * extent >> 1`` -- this is what makes slowly decaying tails (E_Q[exp(a x)] under
  Laplace noise with |a| close to eps) accurate;
* panels graded geometrically towards each root (``width * 2^-j``, j = 0..grade), which restores
  exponential convergence for the endpoint singularity |z - r|^A.

Coordinates here are standardised: z = x / scale, so the noise is Lap(0, 1) or N(0, 1) and the shifted
law is centred at delta = shift / scale.

All functions are numpy (no JAX): the grids are built once per solver round, outside ``jit``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np


def logsumexp(x: np.ndarray) -> float:
    """log(sum(exp(x))) in numpy, robust to -inf entries."""
    x = np.asarray(x, dtype=np.float64)
    top = float(np.max(x))
    if not np.isfinite(top):
        return top
    return top + float(np.log(np.sum(np.exp(x - top))))


_LOG_HALF = math.log(0.5)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@functools.lru_cache(maxsize=16)
def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-1, 1] (``n`` points, exact for degree 2n - 1)."""
    x, w = np.polynomial.legendre.leggauss(n)
    return x, w


def log_density(family: str, z: np.ndarray, centre: float) -> np.ndarray:
    """Log density of the standardised law centred at ``centre``: Lap(centre, 1) or N(centre, 1)."""
    d = np.asarray(z, dtype=np.float64) - centre
    if family == "laplace":
        return _LOG_HALF - np.abs(d)
    return -0.5 * d * d - _LOG_SQRT_2PI


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    intervals = sorted(intervals)
    out: list[list[float]] = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _geometric_offsets(width: float, length: float) -> np.ndarray:
    """Offsets width * (2^j - 1), j = 1.., up to the first one >= length (panel widths double)."""
    n = max(1, math.ceil(math.log2(length / width + 1.0)))
    return width * (2.0 ** np.arange(1, n + 1) - 1.0)


def base_edges(
    centres: Iterable[float],
    kinks: Iterable[float] = (),
    *,
    half_width: float,
    width: float,
    extent: float,
) -> np.ndarray:
    """Sorted panel edges: uniform near each centre, geometric in gaps and tails, kinks as edges.

    Args:
      centres: Points around which the integrand lives (density modes, integrand modes).
      kinks: Points where the integrand is not smooth; each becomes a panel edge.
      half_width: Half-width of the uniform region around each centre.
      width: Uniform panel width (and first geometric panel width).
      extent: How far the geometric tails reach beyond the outermost uniform region.

    Returns:
      A sorted 1-D array of unique edges.

    """
    regions = _merge([(c - half_width, c + half_width) for c in centres])
    edges: list[np.ndarray] = []
    for a, b in regions:
        n = max(1, math.ceil((b - a) / width))
        edges.append(np.linspace(a, b, n + 1))
    for (_, b), (a, _) in zip(regions[:-1], regions[1:], strict=True):
        mid = 0.5 * (a + b)
        offs = _geometric_offsets(width, mid - b)
        offs = offs[offs < mid - b]
        edges.append(b + offs)
        edges.append(a - offs)
        edges.append(np.array([mid]))
    lo, hi = regions[0][0], regions[-1][1]
    tail = _geometric_offsets(width, extent)
    edges.append(lo - tail)
    edges.append(hi + tail)
    edges.append(np.asarray(list(kinks), dtype=np.float64))
    return np.unique(np.concatenate(edges))


def graded_edges(points: Iterable[float], *, width: float, levels: int) -> np.ndarray:
    """Edges r and r +- width * 2^-j (j = 0..levels) around each point r, for endpoint singularities."""
    pts = np.asarray(list(points), dtype=np.float64)
    if pts.size == 0:
        return np.zeros(0)
    offs = width * 2.0 ** -np.arange(levels + 1)
    offs = np.concatenate([[0.0], offs, -offs])
    return (pts[:, None] + offs[None, :]).ravel()


def rule_from_edges(edges: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes and weights on the panels between sorted ``edges``.

    ``edges`` may be batched ``[..., K + 1]`` (each row sorted); the result is ``[..., K * n]``. Zero-width
    panels (repeated edges) get zero weights, so callers can keep rectangular batches by repeating edges.
    """
    x, w = gauss_legendre(n)
    a = edges[..., :-1]
    b = edges[..., 1:]
    half = 0.5 * (b - a)
    mid = 0.5 * (a + b)
    nodes = mid[..., None] + half[..., None] * x
    weights = half[..., None] * w
    shape = edges.shape[:-1] + (-1,)
    return nodes.reshape(shape), weights.reshape(shape)


def rule_1d(
    centres: Iterable[float],
    kinks: Iterable[float] = (),
    roots: Iterable[float] = (),
    *,
    half_width: float = 12.0,
    width: float = 0.5,
    extent: float = 512.0,
    n: int = 10,
    n_wide: int = 20,
    grade: int = 20,
) -> tuple[np.ndarray, np.ndarray]:
    """A sorted composite rule on R (see the module docstring); roots far outside are ignored.

    Panels up to ``width`` wide (uniform and graded ones) get ``n`` Gauss-Legendre points, wider
    geometric panels ``n_wide``: exp(-z) over a panel of width 8 still needs ~20 points for 1e-14.

    Roots beyond the covered range (more than ``extent`` past the uniform regions) are dropped: the
    integrand there is negligible and a root near 1e14 (a tiny leading coefficient) would otherwise
    create a useless giant panel (docs/theory/mechanisms.md, quadrature pitfall).

    Returns:
      ``(nodes, weights)``, nodes sorted ascending.

    """
    edges = base_edges(centres, kinks, half_width=half_width, width=width, extent=extent)
    lo, hi = edges[0], edges[-1]
    r = np.asarray([x for x in roots if lo < x < hi], dtype=np.float64)
    if r.size:
        edges = np.unique(np.concatenate([edges, graded_edges(r, width=width, levels=grade)]))
        edges = edges[(edges >= lo) & (edges <= hi)]
    # Merge edges closer than rounding (a root landing next to a uniform edge would make a panel of
    # width 1e-16 whose nodes all sit on the root).
    keep_edge = np.concatenate([[True], np.diff(edges) > 1e-12 * (1.0 + np.abs(edges[1:]))])
    edges = edges[keep_edge]
    narrow = np.diff(edges) <= 1.01 * width
    parts = []
    for mask, k in ((narrow, n), (~narrow, n_wide)):
        # each group: its panels as (left, right) pairs
        pairs = np.stack([edges[:-1][mask], edges[1:][mask]], axis=1)
        nodes, weights = rule_from_edges(pairs, k)
        parts.append((nodes.ravel(), weights.ravel()))
    nodes = np.concatenate([parts[0][0], parts[1][0]])
    weights = np.concatenate([parts[0][1], parts[1][1]])
    order = np.argsort(nodes, kind="stable")
    nodes, weights = nodes[order], weights[order]
    keep = weights > 0
    return nodes[keep], weights[keep]


def sign_change_roots(z: np.ndarray, h: np.ndarray, fn, *, iterations: int = 80) -> np.ndarray:
    """Roots of a continuous function located by sign changes of ``h = fn(z)`` on sorted nodes ``z``.

    Each bracket [z_i, z_{i+1}] with h_i h_{i+1} < 0 is refined by vectorised bisection with ``fn``
    (numpy, ``[k] -> [k]``). Exact zeros at nodes are returned as they are.
    """
    s = np.sign(h)
    exact = z[s == 0]
    idx = np.nonzero(s[:-1] * s[1:] < 0)[0]
    if idx.size == 0:
        return exact
    a, b = z[idx].copy(), z[idx + 1].copy()
    fa = h[idx].copy()
    for _ in range(iterations):
        m = 0.5 * (a + b)
        fm = fn(m)
        left = np.sign(fm) == np.sign(fa)
        a = np.where(left, m, a)
        fa = np.where(left, fm, fa)
        b = np.where(left, b, m)
        if np.all(b - a <= 1e-15 * (1.0 + np.abs(a))):
            break
    return np.concatenate([exact, 0.5 * (a + b)])
