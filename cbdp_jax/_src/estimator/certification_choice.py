"""The finite-sample plan, chosen on validation samples: the B of ``B tanh(h / B)`` and the method.

Each candidate B (and each method, Berry-Esseen or betting) is scored by the bound it would give at
the test sample size, predicted from the validation differences (:func:`predicted_bound`); the best
is used (:func:`choose_bound`, and :func:`choose_bounds` for several multiples ``t h`` at once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cbdp_jax._src.estimator.certification_support import (
    _bounded,
    _padded_conjugate,
    _terms,
    support,
    supports,
)
from cbdp_jax._src.privacy.divergences import Divergence
from cbdp_jax._src.statistics import berry_esseen, bounds
from cbdp_jax._src.statistics import moments as mom

_B_CANDIDATES = 32


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
