"""f* on the host, its range on an interval, and the support of a bounded critic's differences.

The finite-sample bounds need the interval Z = h(X) - f*(h(Y)) lies in: for a critic with values in
[lo, hi] that is [lo - max f*, hi - min f*] over [lo, hi], the minimum of the convex f* bracketed
rigorously (:func:`conjugate_ranges`), both ends widened for float32 rounding
(:func:`rounding_slack`). f* itself is one compiled program, padded to a bucket so that a few
programs serve every size (:func:`_padded_conjugate`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from cbdp_jax._src.infra.programs import persistent_jit
from cbdp_jax._src.privacy.divergences import Divergence


@persistent_jit(static_argnames=("div",))
def _conjugate_program(s: jax.Array, *, div: Divergence) -> jax.Array:
    """f*(s) as one compiled program (eagerly, each operation would be a program of its own)."""
    return div.conjugate(s)


def _conj64(div: Divergence, s) -> np.ndarray:
    """f*(s) in float64 (a scoped 64-bit JAX), whatever the global precision.

    Padded to a bucket as :func:`_conjugate_host` is: the grids of the certificate's searches have
    many shapes, and each would otherwise be a program of its own to compile.
    """
    with jax.enable_x64(True), np.errstate(all="ignore"):
        return _padded_conjugate(div, np.asarray(s, np.float64))


# The smallest bucket of :func:`_padded_conjugate`, by the width of the dtype in bytes. An estimate
# calls f* a few times on a few thousand to a hundred thousand values (the held-out terms of the
# validation samples in float32; the certificate's grids in float64, 320 to 82,080 values at 10^4 and
# 10^5 samples per side): these minimums put all of them in one bucket per dtype, where several
# programs were compiled before (each call computes at most a few hundred thousand f* more).
_CONJUGATE_MIN_ROWS = {4: 1 << 15, 8: 1 << 17}


def _padded_conjugate(div: Divergence, h: np.ndarray) -> np.ndarray:
    """f*(h) (any shape) by :func:`_conjugate_program` on ``h`` flattened and zero-padded to a bucket.

    The bucket is a power of two, at least :data:`_CONJUGATE_MIN_ROWS` of the dtype: one compiled
    program per bucket and dtype. f* is elementwise, so each value is bit for bit what an unpadded
    call gives.
    """
    flat = h.ravel()
    width = jax.dtypes.canonicalize_dtype(flat.dtype).itemsize  # the dtype the program runs in
    least = _CONJUGATE_MIN_ROWS.get(width, 1 << 14)
    size = max(least, 1 << max(flat.size - 1, 0).bit_length())
    padded = np.zeros(size, flat.dtype)
    padded[: flat.size] = flat
    out = np.asarray(_conjugate_program(padded, div=div), np.float64)
    return out[: flat.size].reshape(h.shape)


def conjugate_range(div: Divergence, a: float, b: float) -> tuple[float, float]:
    """Rigorous (min, max) bounds of the convex f* over [a, b] (:func:`conjugate_ranges` of one)."""
    fmin, fmax = conjugate_ranges(div, np.array([a], np.float64), np.array([b], np.float64))
    return float(fmin[0]), float(fmax[0])


_RANGE_GRID = 513


def conjugate_ranges(
    div: Divergence, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rigorous (min, max) bounds of the convex f* over each interval [a_k, b_k], all at once.

    The max of a convex function is at an endpoint. The min is bracketed on a grid, refined twice
    around the best point, and lowered by (largest secant slope) x (final spacing): on a convex
    function the slopes inside a bracket lie between those of its neighbouring secants, so the true
    minimum cannot be lower. Both ends also move outwards by a relative 1e-9 for rounding. Every
    interval's grid goes through one device program per round (the finite-sample plan asks for ~30
    intervals per call); each row is computed exactly as it would be alone.
    """
    lo_x, hi_x = np.array(a, np.float64, ndmin=1), np.array(b, np.float64, ndmin=1)
    rows = np.arange(lo_x.size)
    best, slack = np.full(lo_x.size, math.inf), np.zeros(lo_x.size)
    active = np.ones(lo_x.size, bool)  # a row whose bracket closed stops refining, as a break would
    near = np.arange(-2, 3)
    for _ in range(3):
        grid = np.linspace(lo_x, hi_x, _RANGE_GRID, axis=-1)
        values = _conj64(div, grid)
        j = np.argmin(values, axis=-1)
        at_j = values[rows, j]
        best = np.where(active & (at_j < best), at_j, best)
        # The secant slopes between the (up to 5) grid points around the minimum.
        idx = j[:, None] + near
        valid = (idx >= 0) & (idx < _RANGE_GRID)
        pts = values[rows[:, None], np.clip(idx, 0, _RANGE_GRID - 1)]
        step = grid[:, 1] - grid[:, 0]
        with np.errstate(all="ignore"):
            slopes = np.diff(pts, axis=-1) / step[:, None]
        pair = valid[:, 1:] & valid[:, :-1]
        ok = np.all(np.isfinite(slopes) | ~pair, axis=-1)
        steepest = np.max(np.where(pair, np.abs(slopes), 0.0), axis=-1)
        slack = np.where(active, np.where(ok, steepest * step, math.inf), slack)
        lo_n = grid[rows, np.maximum(j - 1, 0)]
        hi_n = grid[rows, np.minimum(j + 1, _RANGE_GRID - 1)]
        lo_x, hi_x = np.where(active, lo_n, lo_x), np.where(active, hi_n, hi_x)
        active &= hi_x > lo_x
    fmin = best - slack
    ends = _conj64(div, np.stack([np.asarray(a, np.float64), np.asarray(b, np.float64)], axis=-1))
    ends = ends.reshape(lo_x.size, 2)
    fmax = np.where(ends[:, 1] > ends[:, 0], ends[:, 1], ends[:, 0])
    return fmin - 1e-9 * (1.0 + np.abs(fmin)), fmax + 1e-9 * (1.0 + np.abs(fmax))


# Allowance for the rounding of Z = h(X) - f*(h(Y)) in float32: the held-out differences are computed in
# the evaluation dtype, so a critic saturating at +-B can land a rounding error outside the
# real-arithmetic support, and the betting bound rejects any point outside its stated support. h carries
# a relative error of a few units in the last place (EPS32 = 2^-23); f* turns a relative error d of h
# into h f*'(h) d, which for the alpha family is A = alpha / (alpha - 1) times f*(h) (21 at alpha 1.05),
# so the allowance is ROUNDING_ULPS units of (1 + |h| + |f*(h)| + |h f*'(h)|) at the ends of the range.
EPS32 = float(np.finfo(np.float32).eps)
ROUNDING_ULPS = 16


def support(div: Divergence, bound: float) -> tuple[float, float]:
    """(lo, hi) of Z = h(X) - f*(h(Y)) for a critic with values in (-bound, bound).

    See :func:`interval_support`.
    """
    return interval_support(div, -bound, bound)


def supports(div: Divergence, bounds_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`support` of each bound in ``bounds_``, in one pass (the same values, row by row)."""
    b = np.asarray(bounds_, np.float64)
    return interval_supports(div, -b, b)


def interval_support(div: Divergence, lo_h: float, hi_h: float) -> tuple[float, float]:
    """(lo, hi) of Z = h(X) - f*(h(Y)) for a critic with values in [lo_h, hi_h].

    Both ends are widened by :func:`rounding_slack`, so float32 differences stay inside (a wider
    support only loosens a finite-sample bound).
    """
    lo, hi = interval_supports(div, np.array([lo_h]), np.array([hi_h]))
    return float(lo[0]), float(hi[0])


def interval_supports(
    div: Divergence, lo_h: np.ndarray, hi_h: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interval_support` of each interval ``[lo_h[k], hi_h[k]]``, in one pass."""
    lo_h, hi_h = np.array(lo_h, np.float64, ndmin=1), np.array(hi_h, np.float64, ndmin=1)
    fmin, fmax = conjugate_ranges(div, lo_h, hi_h)
    slack = rounding_slacks(div, lo_h, hi_h, fmin, fmax)
    return lo_h - fmax - slack, hi_h - fmin + slack


def rounding_slack(div: Divergence, lo_h: float, hi_h: float, fmin: float, fmax: float) -> float:
    """How far float32 rounding can move Z beyond its real-arithmetic range for h in [lo_h, hi_h].

    ``ROUNDING_ULPS * EPS32 * (1 + max|h| + max|f*(h)| + max|h| max|f*'(h)|)``; f* is convex, so |f*'|
    is largest at an end of the interval (central differences in float64). Infinite when f* or its
    slope is not finite there (the support is then infinite and a finite-sample bound is refused).
    """
    one = lambda x: np.array([x], np.float64)  # noqa: E731
    return float(rounding_slacks(div, one(lo_h), one(hi_h), one(fmin), one(fmax))[0])


def rounding_slacks(div: Divergence, lo_h, hi_h, fmin, fmax) -> np.ndarray:
    """:func:`rounding_slack` of each interval, in one pass."""
    ends = np.stack([lo_h, hi_h], axis=-1)
    top_h = np.max(np.abs(ends), axis=-1)
    step = 1e-6 * np.maximum(top_h, 1e-6)
    with np.errstate(all="ignore"):
        slopes = (_conj64(div, ends + step[:, None]) - _conj64(div, ends - step[:, None])) / (
            2.0 * step[:, None]
        )
    finite = np.all(np.isfinite(slopes), axis=-1) & np.isfinite(fmin) & np.isfinite(fmax)
    with np.errstate(all="ignore"):
        size = (
            1.0
            + top_h
            + np.maximum(np.abs(fmin), np.abs(fmax))
            + top_h * np.max(np.abs(slopes), axis=-1)
        )
    return np.where(finite, ROUNDING_ULPS * EPS32 * size, math.inf)


def _bounded(h: np.ndarray, b, t=1.0) -> np.ndarray:
    """``B tanh(t h / B)``, computed in one array (``t h``, then divided, tanh'd and scaled in place).

    ``b`` and ``t`` may be columns ``[K, 1]`` against ``h`` ``[1, n]`` (one row per candidate): the
    multiplier search scores 160 rows of up to 32,768 pairs at once.
    """
    out = np.multiply(t, h)
    np.divide(out, b, out=out)
    np.tanh(out, out=out)
    return np.multiply(b, out, out=out)


def _terms(div: Divergence, h_p: np.ndarray, h_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The f-form's two terms ``(h(X), f*(h(Y)))`` in float64, f* computed as the evaluation does."""
    return np.asarray(h_p, np.float64), _conjugate_host(div, h_q)


def _conjugate_host(div: Divergence, h: np.ndarray) -> np.ndarray:
    """f*(h) of a host array of any shape, by the float32 program the held-out evaluation runs.

    The values are flattened and padded to a power-of-two bucket (:func:`_padded_conjugate`), so
    that one compiled program serves every size in a bucket; f* is elementwise, so each value is bit
    for bit what an unpadded call gives (``tests/test_certification.py``).
    """
    with np.errstate(all="ignore"):
        return _padded_conjugate(div, np.asarray(h))
