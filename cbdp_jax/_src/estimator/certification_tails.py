"""The tail check an asymptotic bound must clear, decided on validation samples before the test.

:func:`clears_tails` says whether a critic's validation terms clear the check the test will apply
(:func:`tail_target`); for KL, whose conjugate's tail moves with the critic's scale, a shrunken
member t * h of the class may clear it where h does not (:func:`shrink_for_tails`, and
:func:`shrink_for_tails_traced` inside a compiled program). The held-out tail sketches' centres are
chosen here too (:func:`centres_of`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator.certification_support import (
    _terms,
)
from cbdp_jax._src.privacy.divergences import Divergence, kl_optimal_shift
from cbdp_jax._src.statistics import berry_esseen, bounds, selection, tails
from cbdp_jax._src.statistics import held_out as ho
from cbdp_jax._src.statistics import moments as mom
from cbdp_jax._src.statistics.held_out import UNRELIABLE_SHARE

_SHRINK_GRID = tuple(float(t) for t in np.geomspace(1.0, 0.05, 40))


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
