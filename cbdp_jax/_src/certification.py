"""From a trained critic to a certified lower bound: what is decided on validation data, and how.

A held-out bound is honest only if everything that shapes it is fixed before the test samples are
seen. This module makes those choices on VALIDATION samples (docs/theory/bounds.md, "What is decided
where"):

- the guarantee (``'finite-sample'`` or ``'asymptotic'``; ``'auto'`` picks finite-sample for bounded
  classes, and for an unbounded class the asymptotic bound on D^H when the critic's validation tails
  clear the check the test will apply, the finite-sample bound of its bounded version otherwise);
- for a finite-sample bound on an unbounded class, the bound B of the critic ``B tanh(h / B)`` (which
  makes the f-form terms bounded, so the bound needs no assumption) and the finite-sample method
  (Berry-Esseen or betting), by the bound each would give at the test sample size;
- for an asymptotic KL bound whose critic has a visibly heavy tail on validation data, a shrunken
  member t * h of the same class (a cone) whose tails clear the margin: a smaller but certifiable
  value. Only KL's exponential conjugate has a tail index that moves with t
  (:func:`shrink_changes_tails`).

It also knows the support of the paired differences of a bounded critic, which the finite-sample bounds
need, and the largest value a sample size can certify; and it says, in one place (:func:`target`), what
a bound is a bound on: the class it certifies, whether that class lies inside the class the user named
(only then is it a bound on D^H of that class), and the assumption it rests on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.divergences import Divergence, get_divergence, kl_optimal_shift
from cbdp_jax._src.programs import persistent_jit
from cbdp_jax._src.statistics import berry_esseen, bounds, selection, tails
from cbdp_jax._src.statistics import held_out as ho
from cbdp_jax._src.statistics import moments as mom
from cbdp_jax._src.statistics.bounds import Bound, renyi_slope, to_reported
from cbdp_jax._src.statistics.held_out import HEAVY_TAIL_SHARE, UNRELIABLE_SHARE, HeldOut
from cbdp_jax._src.validation import check_choice

GUARANTEE_CHOICES = ("auto", "class", "finite-sample", "asymptotic")
METHOD_CHOICES = ("auto", "berry-esseen", "betting")
_B_CANDIDATES = 32
_SHRINK_GRID = tuple(float(t) for t in np.geomspace(1.0, 0.05, 40))


class Plan(NamedTuple):
    """How a trained critic will be evaluated and certified, fixed on validation data.

    Attributes:
      guarantee: ``'finite-sample'`` or ``'asymptotic'``.
      method: ``'clt'``, ``'berry-esseen'`` or ``'betting'``.
      bound: B of the bounded critic (``inf``: unbounded).
      scale: The critic's scale (after any shrink).
      shift: The critic's constant (after any shrink).
      tail_shrink: The factor t applied to h to clear the tail check (1.0: none).
      support: ``(lo, hi)`` of the paired differences for a finite-sample bound, else None.
      certified_class: Label of the class the bound is on (``'3.1*tanh(mlp(32x2))'`` for a bounded
        critic built from ``mlp(32x2)``).
      inside_trained_class: Whether the certified critic is a member of the trained class (a shrunk
        member t * h of a cone is; ``B tanh(h / B)`` of an unbounded class is not).
      choice: Why this guarantee was used (``'auto'`` explains its pick).

    """

    guarantee: str
    method: str
    bound: float
    scale: float
    shift: float
    tail_shrink: float
    support: tuple[float, float] | None
    certified_class: str
    inside_trained_class: bool = True
    choice: str = ""


def resolve_guarantee(guarantee: str, spec) -> str:
    """``'auto'`` and ``'class'``: finite-sample for a bounded class (its terms are bounded), else asymptotic.

    This is the guarantee before any data is seen. ``'class'`` keeps it: the bound is always on the
    class itself. The estimator's ``'auto'`` then falls back to the finite-sample bound of ``B tanh(h /
    B)`` when the asymptotic one's tail check fails on validation data (a bound on another class).
    """
    check_choice("guarantee", guarantee, GUARANTEE_CHOICES)
    if guarantee not in ("auto", "class"):
        return guarantee
    return "finite-sample" if spec.bound is not None else "asymptotic"


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


def predicted_bound(
    z_val: np.ndarray, lo: float, hi: float, n: int, confidence: float
) -> tuple[float, str]:
    """The bound each finite-sample method would give at n, predicted from validation differences."""
    if z_val.size < 4 or not np.all(np.isfinite(z_val)):
        return -math.inf, "betting"
    m_val, pairs_val = berry_esseen.moments_of_sample(z_val)
    return predicted_bound_from_moments(m_val, pairs_val, lo, hi, n, confidence)


def predicted_bound_from_moments(
    m_val: mom.Moments,
    pairs_val: berry_esseen.PairMoments,
    lo: float,
    hi: float,
    n: int,
    confidence: float,
) -> tuple[float, str]:
    """The bound each finite-sample method would give at n, from validation moments.

    The Berry-Esseen prediction runs the real bound on moments with the validation means and
    variances but the test count, so it includes the moment bounds' slack (which grows with the
    range); the betting prediction is its large-n width plus a range term. Returns the better
    predicted bound and its method.
    """
    count = float(m_val.count)
    mean = float(m_val.mean)
    if count < 4 or not math.isfinite(mean):
        return -math.inf, "betting"
    sigma = math.sqrt(max(float(m_val.m2), 0.0) / (count - 1.0))
    log_inv = math.log(1.0 / (1.0 - confidence))
    bet = sigma * math.sqrt(2.0 * log_inv / n) + (hi - lo) * log_inv / (0.5 * n)
    if sigma <= 0:
        return mean - bet, "betting"
    scale = n / count

    def rescaled(m: mom.Moments) -> mom.Moments:
        return m._replace(count=m.count * scale, m2=m.m2 * scale)

    pred = berry_esseen.lower_bound(
        rescaled(m_val),
        berry_esseen.PairMoments(rescaled(pairs_val.w), rescaled(pairs_val.v)),
        lo,
        hi,
        confidence,
    )
    be = mean - pred.lower if pred.feasible else math.inf
    if be < bet:
        return mean - be, "berry-esseen"
    return mean - bet, "betting"


def validation_score(
    div: Divergence,
    crit_p: np.ndarray,
    crit_q: np.ndarray,
    test_support: tuple[float, float] | None,
    *,
    n_test: int,
    confidence: float,
) -> float:
    """The bound a planned critic is predicted to give at ``n_test``, from its validation outputs.

    f-scale; ``-inf`` when not finite. ``test_support`` is the finite-sample plan's support (the better
    method's prediction is used), or None for an asymptotic plan (the CLT bound mean - z sd / sqrt(n)).
    It compares critics on validation samples (e.g. one per input map); it certifies nothing.
    """
    n = min(crit_p.size, crit_q.size)
    t_p, t_q = _terms(div, np.asarray(crit_p[:n]), np.asarray(crit_q[:n]))
    diff = t_p - t_q
    if test_support is not None:
        value, _ = predicted_bound(diff, test_support[0], test_support[1], n_test, confidence)
    elif n < 2 or not np.all(np.isfinite(diff)):
        value = -math.inf
    else:
        sd = float(np.std(diff, ddof=1))
        value = float(np.mean(diff)) - bounds.z_quantile(confidence) * sd / math.sqrt(n_test)
    return value if math.isfinite(value) else -math.inf


def choose_bound(
    div: Divergence,
    h_val_p: np.ndarray,
    h_val_q: np.ndarray,
    *,
    n_test: int,
    confidence: float,
    method: str = "auto",
    fixed_bound: float | None = None,
) -> tuple[float, str, tuple[float, float]]:
    """B (unless ``fixed_bound``) and the finite-sample method maximising the predicted test bound.

    Args:
      div: The divergence.
      h_val_p: The unbounded critic on validation samples of P, ``[n]``.
      h_val_q: On validation samples of Q, ``[m]``.
      n_test: Paired held-out samples the bound will use.
      confidence: The level of that bound.
      method: ``'auto'`` or a fixed method.
      fixed_bound: Use this B (a class that is bounded already) instead of choosing one.

    Returns:
      ``(B, method, support)``.

    """
    h_p, h_q = _paired(h_val_p, h_val_q)
    if fixed_bound is not None:
        return _best_bound(div, h_p, h_q, [float(fixed_bound)], n_test, confidence, method, True)
    b, m, sup, _ = choose_bounds(
        div, h_p, h_q, [1.0], n_test=n_test, confidence=confidence, method=method
    )[0]
    return b, m, sup


def choose_bounds(
    div: Divergence,
    h_val_p: np.ndarray,
    h_val_q: np.ndarray,
    multipliers: Sequence[float],
    *,
    n_test: int,
    confidence: float,
    method: str = "auto",
    grid: int = _B_CANDIDATES,
) -> list[tuple[float, str, tuple[float, float], float]]:
    """:func:`choose_bound` for each critic ``t h`` (t in ``multipliers``), with its prediction.

    Returns one ``(B, method, support, prediction)`` per multiplier: the B among ``grid`` candidates
    that :func:`choose_bound` picks for ``t h`` (with ``grid`` = 32 exactly its B), and the bound
    :func:`validation_score` predicts for ``B tanh(t h / B)`` on these samples (f-scale; -inf when not
    finite). Every multiplier's candidates are scored together, as rows of one array; each row exactly
    as alone (``tests/test_certification.py``).
    """
    h_p, h_q = _paired(h_val_p, h_val_q)
    rows = [(b, t) for t in multipliers for b in _b_grid(div, t * h_p, t * h_q, grid)]
    los, his = supports(div, np.asarray([b for b, _ in rows], np.float64))
    usable = [
        (b, lo, hi, t) for (b, t), lo, hi in zip(rows, los, his, strict=True)
        if math.isfinite(lo) and math.isfinite(hi)
    ]  # fmt: skip
    best: dict[float, tuple] = {}
    for i, value, m in _predictions(div, h_p, h_q, usable, n_test, confidence, False):
        b, lo, hi, t = usable[i]
        if t not in best or value > best[t][0]:  # the first of equal maxima
            best[t] = (value, b, method if method != "auto" else m, (lo, hi))
    out = []
    for t in multipliers:
        if t in best:
            value, b, m, sup = best[t]
            out.append((b, m, sup, value))
            continue
        # Every B on the grid made f*(+-B) overflow (a critic with enormous outputs, e.g. against a
        # nearly non-private mechanism), or no prediction was finite: search below the largest B
        # whose terms are finite instead.
        b, m, sup = _below_overflow(div, t * h_p, t * h_q, n_test, confidence, method)
        score = validation_score(
            div, _bounded(h_p, b, t), _bounded(h_q, b, t), sup, n_test=n_test,
            confidence=confidence,
        )  # fmt: skip
        out.append((b, m, sup, score))
    return out


def _paired(h_val_p, h_val_q) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n = min`` values of each side in float64 (the predictions pair them)."""
    n = min(np.size(h_val_p), np.size(h_val_q))
    return np.asarray(h_val_p[:n], np.float64), np.asarray(h_val_q[:n], np.float64)


def _b_grid(div: Divergence, h_p: np.ndarray, h_q: np.ndarray, size: int) -> list[float]:
    """``size`` candidate B of a critic, geometric from a quarter of its median size to 4x its max."""
    both = np.abs(np.concatenate([h_p, h_q]))
    top = float(np.max(both)) if h_p.size else 1.0
    med = float(np.median(both)) if h_p.size else 1.0
    lo_b = max(0.25 * med, 1e-3)
    hi_b = max(4.0 * top, 2.0 * lo_b)
    candidates = list(np.geomspace(lo_b, hi_b, size))
    if div.conjugate_sup < math.inf:
        cap = 0.99 * div.conjugate_sup
        candidates = sorted({min(b, cap) for b in candidates})
    return candidates


def _below_overflow(div, h_p, h_q, n_test, confidence, method):
    """``(B, method, support)`` on a grid of B below the largest with finite f*(+-B)."""
    cap = largest_finite_bound(div)
    small = list(np.geomspace(min(1e-3, cap / 2), cap, _B_CANDIDATES))
    found = _best_bound(div, h_p, h_q, small, n_test, confidence, method, False)
    return found or (cap, _fixed_method(method), support(div, cap))


def _best_bound(div, h_p, h_q, candidates, n_test, confidence, method, fixed):
    """``(B, method, support)`` of the candidate with the best predicted bound.

    None when no candidate has a finite support and finite validation terms; for a fixed bound its
    support then, finite or not (an infinite one makes the bound refused, with its reason). Every
    candidate's terms and moments are computed at once (rows of one array); each prediction is the
    one :func:`predicted_bound` makes for that candidate alone.
    """
    # The ends stay NumPy float64, as one support at a time gave them (berry_esseen.lower_bound
    # takes Python floats as well; this keeps the plan's values and types as they were).
    los, his = supports(div, np.asarray(candidates, np.float64))
    usable = [
        (b, lo, hi, 1.0) for b, lo, hi in zip(candidates, los, his, strict=True)
        if math.isfinite(lo) and math.isfinite(hi)
    ]  # fmt: skip
    best = None
    for i, value, m in _predictions(div, h_p, h_q, usable, n_test, confidence, fixed):
        if method != "auto":
            m = method
        if best is None or value > best[0]:
            best = (value, usable[i][0], m, usable[i][1:3])
    if best is None:
        if fixed:
            return candidates[0], _fixed_method(method), support(div, candidates[0])
        return None
    return best[1], best[2], best[3]


# Candidates scored together: at most this many validation terms per array (32 MiB of float64).
_ROWS_BUDGET = 1 << 20


def _predictions(div, h_p, h_q, usable, n_test, confidence, fixed):
    """``(i, prediction, method)`` for each ``usable[i] = (B, lo, hi, t)`` with a finite prediction.

    Row i scores the critic ``B tanh(t h / B)`` (``h`` itself when ``fixed``); each prediction is what
    :func:`predicted_bound` gives for that candidate alone. Candidates are scored in groups (rows of
    one array, at most ``_ROWS_BUDGET`` values each).
    """
    per_group = max(1, _ROWS_BUDGET // max(h_p.size, 1))
    out = []
    for start in range(0, len(usable), per_group):
        group = usable[start : start + per_group]
        b = np.asarray([c[0] for c in group], np.float64)[:, None]
        t = np.asarray([c[3] for c in group], np.float64)[:, None]
        shape = (len(group), h_p.size)
        hb_p = np.broadcast_to(h_p, shape) if fixed else _bounded(h_p[None, :], b, t)
        hb_q = np.broadcast_to(h_q, shape) if fixed else _bounded(h_q[None, :], b, t)
        t_p, t_q = _terms(div, hb_p, hb_q)
        diff = t_p - t_q
        # predicted_bound's refusals: fewer than 4 pairs, or a non-finite term
        rows = np.flatnonzero(np.all(np.isfinite(diff), axis=1)) if diff.shape[1] >= 4 else []
        if len(rows) == 0:
            continue
        # Every row usable (the common case): the rows as they are, without a gathered copy.
        m_val, pairs_val = berry_esseen.moments_of_rows(
            diff if len(rows) == len(group) else diff[rows]
        )
        for j, r in enumerate(rows):
            lo, hi = group[r][1:3]
            pairs = berry_esseen.PairMoments(mom.take(pairs_val.w, j), mom.take(pairs_val.v, j))
            value, m = predicted_bound_from_moments(
                mom.take(m_val, j), pairs, lo, hi, n_test, confidence
            )
            if math.isfinite(value):
                out.append((start + r, value, m))
    return out


def _fixed_method(method: str) -> str:
    return "betting" if method == "auto" else method


def largest_finite_bound(div: Divergence, dtype=np.float32) -> float:
    """Half the largest B (on a grid up to 1e9) whose f*(B) and f*(-B) are finite in ``dtype``.

    The held-out terms of ``B tanh(h / B)`` are computed in the evaluation dtype, so a B whose conjugate
    overflows there gives no usable difference. Half, so that rounding near the edge never overflows.
    """
    grid = np.geomspace(1e-3, 1e9, 385).astype(dtype)
    with np.errstate(all="ignore"):
        both = _padded_conjugate(div, np.concatenate([grid, -grid])).astype(dtype)
    ok = np.isfinite(both[: grid.size]) & np.isfinite(both[grid.size :])
    if div.conjugate_sup < math.inf:
        ok &= grid < div.conjugate_sup
    return float(grid[ok].max()) / 2.0 if ok.any() else 1e-3


def tail_target(n_test: int, margin: float) -> float:
    """The tail index a critic needs for the held-out check at n_test to pass with its point estimate.

    The check passes when index - z index / sqrt(k) >= 2 + margin, k = tails.default_k(n_test).
    """
    k = tails.default_k(n_test)
    z = bounds.z_quantile(ho.TAIL_CONFIDENCE)
    return (2.0 + margin) / max(1.0 - z / math.sqrt(k), 1e-3)


def shrink_changes_tails(div: Divergence) -> bool:
    """Whether shrinking a critic t * h (t < 1) can raise the tail indices the check reads.

    Hill's index is scale invariant. h(X) scales with t, and so does f*(h) - inf f* for every conjugate
    here whose tail is a power of h (the alpha family, chi^2) or that is bounded above on its domain
    (TV, and Hellinger and JS, which the asymptotic bound refuses anyway once h reaches their pole): their
    indices do not depend on t, and a shrink could only pass the check by an accident of the estimator.
    KL's f*(h) = exp(h - 1) is the exception: exp(t a x) of a Laplace variable x of scale 1/eps has index
    eps / (t a), so a smaller t gives a lighter tail (docs/theory/bounds.md, "A certified member instead").
    """
    return div.name == "kl"


def shrink_for_tails(
    div: Divergence,
    kind: str,
    *,
    h_val_p: np.ndarray,
    h_val_q: np.ndarray,
    h_fit_q: np.ndarray,
    scale: float,
    shift: float,
    need: float,
) -> tuple[float, float, float]:
    """The largest shrink t (a grid from 1 down) whose critic t * h passes the tail check with margin.

    Both validation tail indices' one-sided lower limits must reach ``need``. ``h_*`` are the raw (unscaled) class outputs; the critic is ``scale * h + shift``. For KL the
    constant is refitted for each t on the training outputs ``h_fit_q`` (the Donsker-Varadhan shift),
    otherwise the whole critic is scaled (the class is a cone). Returns ``(scale, shift, t)``; t = 1
    when no shrink is needed or none helps, and always where a shrink cannot change the tail indices
    (:func:`shrink_changes_tails`).
    """
    if not shrink_changes_tails(div):
        return scale, shift, 1.0
    for t in _SHRINK_GRID:
        s = t * scale
        c = t * shift
        if kind == "dv":
            c = float(kl_optimal_shift(jnp.asarray(s * h_fit_q)))
        t_p, t_q = _terms(div, s * h_val_p + c, s * h_val_q + c)
        if _clears(div, t_p, t_q, need):
            return s, c, t
    return scale, shift, 1.0


def _clears(div: Divergence, t_p: np.ndarray, t_q: np.ndarray, need: float) -> bool:
    """Whether validation terms clear the tail check the test will apply (noisy, so against ``need``).

    Both terms finite, both one-sided lower limits of Hill's index at least ``need`` and no single
    term carrying more than ``UNRELIABLE_SHARE`` of the variance of f*(h).
    """
    if not (np.all(np.isfinite(t_p)) and np.all(np.isfinite(t_q))) or t_p.size < 4:
        return False
    held = held_out_of_terms(t_p, t_q, div.conjugate_inf())
    z = bounds.z_quantile(ho.TAIL_CONFIDENCE)
    lows = [i.index - z * i.std_error for i in (tails.hill(held.tail_p), tails.hill(held.tail_q))]
    # The validation estimate is noisy too: its lower limit must clear what the test will need.
    return min(lows) >= need and held.heavy_tail_share() <= ho.UNRELIABLE_SHARE


def clears_tails(
    div: Divergence, crit_p: np.ndarray, crit_q: np.ndarray, *, n_test: int, margin: float
) -> bool:
    """Whether a critic's validation values clear the tail check a test of ``n_test`` will apply.

    ``guarantee='auto'`` uses it to choose, before the test samples are seen, between the asymptotic
    bound on the named class and the finite-sample bound of its bounded version.

    Args:
      div: The divergence.
      crit_p: The critic on validation samples of P.
      crit_q: The critic on validation samples of Q.
      n_test: Held-out samples per side the test will use.
      margin: The check's margin (:func:`tail_target`).

    """
    t_p, t_q = _terms(div, np.asarray(crit_p), np.asarray(crit_q))
    return _clears(div, t_p, t_q, tail_target(n_test, margin))


def _heavy_share_traced(t_q: jax.Array) -> jax.Array:
    """The largest single term's share of the centred sum of squares (``HeldOut.heavy_tail_share``)."""
    dev2 = (t_q - jnp.mean(t_q)) ** 2
    m2 = jnp.sum(dev2)
    return jnp.where(m2 > 0, jnp.max(dev2) / jnp.where(m2 > 0, m2, 1.0), 0.0)


def shrink_for_tails_traced(
    div: Divergence,
    alpha,
    kind: str,
    *,
    h_val_p: jax.Array,
    h_val_q: jax.Array,
    h_fit_q: jax.Array,
    scale,
    shift,
    need: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`shrink_for_tails` for one member inside a compiled program (the sweep vmaps it).

    The same rule on the same grid: the largest t whose critic ``t * scale * h + c`` (c refitted on
    ``h_fit_q`` for KL's Donsker-Varadhan objective, else ``t * shift``) has finite validation terms,
    both validation tail indices' one-sided lower limits at least ``need`` and no validation term
    carrying more than ``UNRELIABLE_SHARE`` of the variance of f*(h); ``(scale, shift, 1)`` when none
    passes. The tail indices are explicit in t (see the body), so the largest t whose indices clear is
    found without walking; a ``while_loop`` starts there and checks only finiteness and the heavy-tail
    share (usually one step; under ``vmap`` the batch steps until its last member has stopped). For
    continuous samples it picks what the host version picks (``tests/test_certification.py``), and
    like it returns the critic as it is where a shrink cannot change the tail indices
    (:func:`shrink_changes_tails`; a static choice, no loop is compiled).

    Args:
      div: The divergence (its conjugate takes the traced order ``alpha``).
      alpha: The order (ignored by KL).
      kind: The training objective's kind (``'dv'`` refits the KL constant).
      h_val_p: Raw class outputs on the validation P sample, ``[n]``.
      h_val_q: Raw class outputs on the validation Q sample, ``[n]``.
      h_fit_q: Raw class outputs on the Q sample the constant is fitted on.
      scale: The fitted scale.
      shift: The fitted shift.
      need: The index both lower limits must reach (:func:`tail_target`).

    Returns:
      ``(scale, shift, t)`` of the chosen member.

    """
    h_val_p, h_val_q, h_fit_q = (jnp.asarray(h) for h in (h_val_p, h_val_q, h_fit_q))
    if not shrink_changes_tails(div):
        like = jnp.zeros((), h_val_p.dtype)
        return like + scale, like + shift, like + 1.0
    k = tails.default_k(h_val_p.shape[-1])
    z = bounds.z_quantile(ho.TAIL_CONFIDENCE)
    grid = jnp.asarray(_SHRINK_GRID, h_val_p.dtype)
    # KL's terms are explicit in t, and Hill's index is scale invariant:
    # - |t_p - median(t_p)| = |s| |h_p - median(h_p)|, so the index of h(X) does not depend on t;
    # - f*(h(Y)) - inf f* = exp(s h_q + c - 1), whose log-spacings are s times those of h_q, so the
    #   index of f*(h(Y)) is its value at t = 1 divided by t (no exponential is formed for it).
    # The largest t whose indices clear `need` is therefore known before the walk; the loop starts at
    # the first grid value at or below it and checks only what still depends on t (finite terms and the
    # heavy-tail share: O(n) each, no sort), usually once. The same rule on the same grid as a walk from
    # t = 1, up to rounding at the boundary.
    low_p = tails.hill_lower_traced(h_val_p, selection.median(h_val_p), k, z)
    low_q1 = _exp_hill_lower(scale * h_val_q, k, z)
    t_star = jnp.where(low_p >= need, low_q1 / need, 0.0)
    start_i = jnp.sum(grid > t_star).astype(jnp.int32)
    big = jnp.log(jnp.finfo(h_val_q.dtype).max)

    def candidate(t):
        s = t * scale
        c = kl_optimal_shift(s * h_fit_q).astype(s.dtype) if kind == "dv" else t * shift
        u = s * h_val_q
        finite = jnp.all(jnp.isfinite(s * h_val_p + c)) & (jnp.max(u) + c - 1.0 < big)
        ok = finite & (_heavy_share_traced(jnp.exp(u - jnp.max(u))) <= UNRELIABLE_SHARE)
        return ok, s, c

    def walk(state):
        i, _, _, _, _ = state
        ok, s, c = candidate(grid[i])
        return i + 1, ok, s, c, grid[i]

    def more(state):
        i, found, _, _, _ = state
        return (i < grid.shape[0]) & ~found

    like = jnp.zeros((), grid.dtype)
    start = (start_i, jnp.zeros((), bool), like + scale, like + shift, like + 1.0)
    _, found, s, c, t = jax.lax.while_loop(more, walk, start)
    one = jnp.ones((), grid.dtype)
    return (
        jnp.where(found, s, scale).astype(grid.dtype),
        jnp.where(found, c, shift).astype(grid.dtype),
        jnp.where(found, t, one),
    )


def _exp_hill_lower(u: jax.Array, k: int, z: float) -> jax.Array:
    """:func:`~cbdp_jax._src.statistics.tails.hill_lower_traced` of exp(u) about 0, from u itself.

    The log-spacings of exp(u) are the spacings of u: Hill's gamma is the mean of the k largest u minus
    the (k + 1)-th, and no exponential (which could overflow) is formed.
    """
    top = tails.top_values(u, k + 1)
    gamma = jnp.mean(top[:k] - top[k])
    index = jnp.where(gamma > 0, 1.0 / jnp.where(gamma > 0, gamma, 1.0), jnp.inf)
    return index * (1.0 - z / math.sqrt(k))


def held_out_of_terms(t_p: np.ndarray, t_q: np.ndarray, centre_q: float) -> ho.HeldOut:
    """Held-out statistics of two whole samples of the f-form terms (the tail check, the CLT bound).

    ``t_p`` are values h(X), ``t_q`` values f*(h(Y)); ``centre_q`` is the centre of f*(h(Y)), the
    conjugate's infimum (:func:`centres_of`). The paired-difference fields are empty: the result
    serves :func:`~cbdp_jax._src.statistics.held_out.tail_check` and the asymptotic
    :func:`~cbdp_jax._src.statistics.held_out.certify` (validation-side decisions, benchmarks).
    """
    cp, cq = centres_of(t_p, centre_q)
    cap = tails.DEFAULT_CAPACITY

    def sk(t, c):
        dev = np.abs(t - c)
        if dev.size > cap:
            dev = np.partition(dev, dev.size - cap)[dev.size - cap :]
        dev = np.sort(dev)[::-1]
        top = np.full(cap, -np.inf)
        top[: dev.size] = dev
        return tails.TailSketch(top, np.asarray(float(t.size)))

    def moments(t):
        mean = float(np.mean(t))
        return mom.Moments(
            float(t.size), mean, float(np.sum((t - mean) ** 2)), float(t.min()), float(t.max())
        )

    e = mom.empty()
    return ho.HeldOut(
        moments(t_p), moments(t_q), e, berry_esseen.PairMoments(e, e), sk(t_p, cp), sk(t_q, cq)
    )


def tail_centres(div: Divergence, h_val_p: np.ndarray, h_val_q: np.ndarray) -> tuple[float, float]:
    """Centres of the held-out tail sketches (see :func:`centres_of`)."""
    t_p, _ = _terms(div, h_val_p, h_val_q)
    return centres_of(t_p, div.conjugate_inf())


def centres_of(t_p: np.ndarray, conjugate_inf: float) -> tuple[float, float]:
    """Tail-sketch centres: the validation median of h(X); the conjugate's infimum for f*(h(Y)).

    Hill's estimator is not location invariant, so the centre decides what it reads. f*(h) is bounded
    below by inf f*, and its upper tail is the one that matters: centred there, the deviations are
    exp(h - 1) for KL (inf 0; Hill is scale invariant, which is what an exp(h) tail needs) and exactly
    C_a |h|^A for the alpha family, whose index is that of |h| over A. Two other centres fail:
    the median (comparable to the threshold, it inflates the log-ratios: exp of a Laplace variable of
    index 4 reads as 2.4) and 0 for a conjugate whose infimum is not 0 (the alpha family's constant
    1/(alpha^2 - alpha) dominates the deviations of a small h and hides a polynomial tail: Student t(3)
    times 0.1 under Renyi-2, index 3/2, reads 3.71). h(X) can take either sign, so it is centred at
    its median.
    """
    finite = t_p[np.isfinite(t_p)]
    return (float(np.median(finite)) if finite.size else 0.0, float(conjugate_inf))


def cap_for(div: Divergence, n: int, confidence: float) -> float:
    """The largest f-scale value ``n`` paired samples can certify (bounded critics of any B)."""
    return _cap(div.name, div.alpha, div.convention, int(n), float(confidence))


@functools.lru_cache(maxsize=256)
def _cap(name: str, alpha, convention: str, n: int, confidence: float) -> float:
    div = get_divergence(name, alpha=alpha, convention=convention)
    return bounds.certifiable_max(lambda s: _conj64(div, s), n, confidence)


class Target(NamedTuple):
    """What a bound is a bound on (docs/theory/bounds.md, "What a bound is a bound on").

    Attributes:
      certified_class: The class the bound certifies: a lower bound on D^H for this H.
      named_class: The class the user named.
      on_named_class: Whether the certified class lies inside the named class, so that the bound is
        also a bound on D^H of the named class. False for ``B tanh(H / B)`` of an unbounded H.
      bounds: In words, what the bound bounds.
      assumption: What the bound rests on (none for a finite-sample bound).

    """

    certified_class: str
    named_class: str
    on_named_class: bool
    bounds: str
    assumption: str


FINITE_SAMPLE_ASSUMPTION = (
    "none: the critic is bounded, so the paired differences lie in a known interval and the bound "
    "holds at every sample size"
)
ASYMPTOTIC_ASSUMPTION = (
    "the central limit theorem for the held-out mean: both f-form terms have finite variance under "
    "the true laws (including beyond the sampled range) and n is large enough; the tail check found "
    "no sign of a tail index below {need:g}, which supports but cannot prove it"
)


def target(
    div: Divergence,
    *,
    guarantee: str,
    certified_class: str,
    named_class: str,
    inside: bool,
    margin: float = ho.TAIL_MARGIN,
) -> Target:
    """The one rule for labelling a bound: its class, whether it bounds the named class, its assumption.

    Args:
      div: The divergence.
      guarantee: ``'finite-sample'``, ``'asymptotic'`` or ``'exact'``.
      certified_class: The class the bound certifies.
      named_class: The class the user named.
      inside: Whether ``certified_class`` is a subset of ``named_class`` (a shrunk member of a cone, a
        lower-degree polynomial, the class itself); False for a bounded version of an unbounded class.
      margin: The tail check's margin (stated in the assumption of an asymptotic bound).

    """
    if guarantee == "finite-sample":
        assumption = FINITE_SAMPLE_ASSUMPTION
    elif guarantee == "exact":
        assumption = "none: from the mechanism's law"
    else:
        assumption = ASYMPTOTIC_ASSUMPTION.format(need=2.0 + margin)
    return Target(
        certified_class,
        named_class,
        inside,
        describe(div, certified_class, named_class, inside),
        assumption,
    )


def describe(
    div: Divergence, certified_class: str, named_class: str | None = None, inside: bool = True
) -> str:
    """What a bound on v(h) bounds: D^H for the certified class, then what that implies."""
    name = div.label
    if named_class is None or named_class == certified_class:
        return f"{name}^H(P||Q) for H = {certified_class}, hence {name}(P||Q)"
    if inside:
        return (
            f"{name}^H(P||Q) for H = {certified_class}, a subset of {named_class}, hence "
            f"{name}^H for H = {named_class} and {name}(P||Q)"
        )
    return (
        f"{name}^H(P||Q) for H = {certified_class}, hence {name}(P||Q); not a bound on "
        f"{name}^H for H = {named_class} (the bounded class is not inside it)"
    )


def reported_bound(div, bound: Bound, spec) -> float:
    """A bound on the reported scale; a refused bound is the trivial one (0 when H has constants)."""
    trivial = 0.0 if spec.contains_constants else -math.inf
    if not bound.certified:
        return trivial
    value = to_reported(div, bound.value)
    return max(value, trivial)


def bound_fields(div, held: HeldOut, bound: Bound, spec, cap: float, warnings: list[str]) -> dict:
    """The estimate, its standard error and the bound on both scales.

    The estimate and its standard error come from ``held.estimate_terms`` (the critic of the named
    class, when the certified critic is a shrunk or bounded version of it); the bound from ``bound``.
    """
    terms = held.estimate_terms
    overflow = not (math.isfinite(float(terms.p.mean)) and math.isfinite(float(terms.p.m2)))
    finite_q = math.isfinite(float(terms.q.mean))
    f_est = terms.estimate if finite_q and not overflow else -math.inf
    f_se = terms.std_error if math.isfinite(f_est) else math.inf
    se = f_se * renyi_slope(div, f_est) if math.isfinite(f_se) else math.inf
    if not bound.certified:
        warnings.append(f"bound not certified: {bound.reason}")
    return {
        "estimate": to_reported(div, f_est),
        "lower_bound": reported_bound(div, bound, spec),
        "std_error": se,
        "f_estimate": f_est,
        "f_lower_bound": bound.value,
        "f_std_error": f_se,
        "bound_reliable": bound.certified,
        "refusal": bound.reason,
        "heavy_tail_share": terms.heavy_tail_share() if math.isfinite(f_est) else 0.0,
        # The held-out value of the critic the bound is for (the estimate's critic, shrunk or bounded).
        "certified_estimate": _finite_reported(div, held.estimate),
        "certifiable_max": to_reported(div, cap),
        # The CLT bound on the same held-out data, for comparison only (unchecked, not certified).
        "f_clt_lower_bound": bounds.clt_lower_bound(
            held.p, held.q, confidence=bound.confidence
        ).value,
    }


def _finite_reported(div, f_value: float) -> float:
    """A held-out f-scale value on the reported scale; -inf where it is not finite."""
    return float(to_reported(div, f_value)) if math.isfinite(f_value) else -math.inf


def diagnostics(
    div, held: HeldOut, fields: dict, val_curve: np.ndarray, insample: HeldOut | None = None
) -> list[str]:
    """Warnings about overflow, heavy tails, the sample-size ceiling, convergence and overfitting."""
    out: list[str] = []
    f_est, f_se = fields["f_estimate"], fields["f_std_error"]
    terms = held.estimate_terms
    if not (math.isfinite(float(terms.p.mean)) and math.isfinite(float(terms.p.m2))):
        out.append(
            "the adversary's outputs overflowed (non-finite) on held-out samples: no estimate; "
            "retry with dtype='float64' or a smaller learning rate"
        )
    elif not math.isfinite(f_est):
        out.append(
            "f*(h) overflowed (non-finite) on held-out Q samples: no estimate; retry with "
            "dtype='float64', more samples or a smaller class"
        )
    share = fields["heavy_tail_share"]
    if HEAVY_TAIL_SHARE < share <= UNRELIABLE_SHARE:
        out.append(
            f"heavy tail: one held-out sample carries {share:.0%} of the variance of f*(h) under Q; "
            "the standard error may be underestimated (docs/theory/bounds.md)"
        )
    n = int(min(float(terms.p.count), float(terms.q.count)))
    cap = fields["certifiable_max"]
    if cap == -math.inf:
        out.append(
            f"{n} samples per side cannot certify any positive value with a finite-sample bound; "
            "use more held-out samples"
        )
    elif math.isfinite(f_est) and fields["estimate"] > cap:
        out.append(
            f"{n} samples per side can certify at most {cap:.4g} with any finite-sample bound; the "
            f"estimate {fields['estimate']:.4g} is beyond what this many samples can confirm"
        )
    elif fields["lower_bound"] <= 0.0 and cap < 1.0:
        out.append(
            f"{n} samples per side can certify at most {cap:.4g} with any finite-sample bound; "
            "use more held-out samples"
        )
    out.extend(_convergence(val_curve, f_se))
    if insample is None:
        return out
    terms = insample.estimate_terms
    gap = terms.estimate - f_est
    # The in-sample value is computed on a subsample of the training pairs at most (the estimator's
    # INSAMPLE_PAIRS): its own standard error is part of the gap's noise.
    se_in = terms.std_error
    noise = math.hypot(f_se, se_in) if math.isfinite(se_in) else f_se
    if math.isfinite(gap) and gap > 3.0 * noise + 0.01 * abs(f_est) + 1e-3:
        out.append(
            f"train/test gap: in-sample value exceeds the held-out estimate by {gap:.3g} "
            f"(> 3 standard errors); the adversary overfits -- use more samples or a smaller class"
        )
    return out


def _convergence(val_curve: np.ndarray, f_se: float) -> list[str]:
    blocks = len(val_curve)
    if blocks < 4 or not math.isfinite(f_se):
        return []
    tail = max(blocks // 4, 1)
    if not np.all(np.isfinite(val_curve[-1 - tail :])):
        return []
    gain = float(val_curve[-1] - val_curve[-1 - tail])
    if np.argmax(val_curve) >= blocks - max(blocks // 10, 1) and gain > max(f_se, 1e-3):
        return [
            f"not converged: validation objective still rose by {gain:.3g} over the last {tail} "
            "evaluation blocks; increase steps"
        ]
    return []


__all__ = [
    "Plan",
    "bound_fields",
    "diagnostics",
    "reported_bound",
    "cap_for",
    "choose_bound",
    "choose_bounds",
    "conjugate_range",
    "clears_tails",
    "describe",
    "held_out_of_terms",
    "interval_support",
    "rounding_slack",
    "target",
    "Target",
    "predicted_bound",
    "resolve_guarantee",
    "shrink_changes_tails",
    "shrink_for_tails",
    "support",
    "tail_centres",
]
