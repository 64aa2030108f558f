"""Finite-sample lower confidence bounds for the mean of a bounded variable, by betting.

For i.i.d. X_1, X_2, ... in [lo, hi] with mean mu, map to u = (X - lo) / (hi - lo) in [0, 1]. For a
candidate mean m in (0, 1] a gambler who bets the fraction lambda_i(m) >= 0 of her wealth on u_i > m has
wealth (the *capital process*)

    K_t(m) = prod_{i <= t} (1 + lambda_i(m) (u_i - m)),     lambda_i(m) = min(lambda_i, c / m),

with lambda_i chosen from u_1..u_{i-1} only (predictable) and c < 1 (so every factor is >= 1 - c > 0).
At m = mu, K_t(mu) is a nonnegative martingale with K_0 = 1, so by Ville's inequality
P(exists t: K_t(mu) >= 1/delta) <= delta. K_t(m) is non-increasing in m (each factor is), so the set
of candidates never rejected is an interval [L_t, 1], and

    P(exists t: mu < L_t) <= delta:

L_t is a lower confidence *sequence*, valid simultaneously over time (so one may stop whenever the bound
is good enough, or the budget is spent), with no assumption beyond boundedness and independence.

The bets are Waudby-Smith and Ramdas' predictable plug-in (their eq. (26)-(27), "PrPl-EB"):
lambda_i = sqrt(2 log(1/delta) / (sigma2_{i-1} * n)) for a bound used at one fixed n, and
sqrt(2 log(1/delta) / (sigma2_{i-1} i log(1 + i))) for a sequence, with sigma2 a regularised running
variance. At large n the fixed-n bound's distance from the mean is about sigma sqrt(2 log(1/delta) / n):
1.49 times the CLT's z_{1-delta} sigma / sqrt(n) at delta = 0.05, the price of Ville's (Markov's)
inequality. :mod:`.berry_esseen` is tighter at large n for a fixed n.

All arithmetic runs in float64 (a scoped ``jax.enable_x64``), so rounding cannot move the bound by more
than about 1e-12 of the range.

References:
  Waudby-Smith, Ramdas, "Estimating means of bounded random variables by betting", JRSS-B 86 (2024),
  section 4 (Theorem 3, the predictable plug-in bets). docs/theory/bounds.md, "Betting".

"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError, check_in_range

TRUNCATION = 0.5  # c: the largest fraction of wealth ever bet (WSR's recommended 1/2 or 3/4)
_BISECTION_STEPS = 60


def _predictable_variance(u: jax.Array, start_count, start_sum, start_sq) -> jax.Array:
    """sigma2_{i-1} for i = 1..n (WSR eq. (27)): the regularised variance of u_1..u_{i-1}.

    ``start_*`` carry the running count, sum of u and sum of (u_j - mu_j)^2 of earlier chunks.
    """
    idx = jnp.arange(u.shape[-1], dtype=u.dtype)
    t = start_count + idx + 1.0  # the index of u_i overall
    csum = start_sum + jnp.cumsum(u)
    mu_i = (0.5 + csum) / (t + 1.0)  # running mean including u_i
    sq = start_sq + jnp.cumsum((u - mu_i) ** 2)
    sigma2_i = (0.25 + sq) / (t + 1.0)
    prev = jnp.concatenate(
        [jnp.reshape((0.25 + start_sq) / (start_count + 1.0), (1,)), sigma2_i[:-1]]
    )
    return prev, t


def _bets(u, n_total, log_inv_delta, anytime: bool, start=(0.0, 0.0, 0.0)):
    sigma2_prev, t = _predictable_variance(u, *start)
    if anytime:
        return jnp.sqrt(2.0 * log_inv_delta / (sigma2_prev * t * jnp.log1p(t)))
    return jnp.sqrt(2.0 * log_inv_delta / (sigma2_prev * n_total))


def _log_capital(u: jax.Array, lam: jax.Array, m) -> jax.Array:
    bet = jnp.minimum(lam, TRUNCATION / m)
    return jnp.sum(jnp.log1p(bet * (u - m)))


@functools.partial(jax.jit, static_argnames=("anytime",))
def _lower_unit(u: jax.Array, log_inv_delta, *, anytime: bool) -> jax.Array:
    """The lower bound on the mean of u in [0, 1] at the last observation (bisection on m)."""
    lam = _bets(u, u.shape[-1], log_inv_delta, anytime)

    def rejected(m):
        return _log_capital(u, lam, m) >= log_inv_delta

    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        r = rejected(mid)
        return jnp.where(r, mid, lo), jnp.where(r, hi, mid)

    tiny = jnp.asarray(1e-12, u.dtype)
    lo, _ = jax.lax.fori_loop(
        0, _BISECTION_STEPS, body, (jnp.zeros((), u.dtype), jnp.ones((), u.dtype))
    )
    # lo is a candidate rejected at every bisection step (or 0): all m <= lo are rejected.
    return jnp.where(rejected(jnp.maximum(lo, tiny)), lo, 0.0)


def lower_bound(x, lo: float, hi: float, confidence: float, *, anytime: bool = False) -> float:
    """A finite-sample lower confidence bound on E[X] from i.i.d. X_i in [lo, hi].

    Args:
      x: The observations ``[n]`` (order matters only through the predictable bets; pass them in the
        order they were drawn).
      lo: A known lower end of the support.
      hi: A known upper end of the support (> lo).
      confidence: The level 1 - delta.
      anytime: Use the bets of a confidence sequence (valid at every n simultaneously, slightly wider
        at any one n) instead of those tuned for this n.

    Returns:
      L with P(E[X] < L) <= delta for every law on [lo, hi]; ``lo`` when nothing can be certified.

    Raises:
      InvalidParameterError: For a confidence outside (0, 1) or an empty support.

    References:
      Waudby-Smith, Ramdas (2024), Theorem 3 and eq. (26)-(27).

    """
    check_in_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    if not hi > lo:
        raise InvalidParameterError(f"hi={hi!r} is invalid: must exceed lo={lo!r}")
    x = np.asarray(x, np.float64).ravel()
    if x.size == 0:
        return float(lo)
    if np.any(x < lo) or np.any(x > hi):
        raise InvalidParameterError(
            f"x is invalid: observations leave the stated support [{lo}, {hi}]"
        )
    with jax.enable_x64(True):
        u = jnp.asarray((x - lo) / (hi - lo), jnp.float64)
        unit = float(_lower_unit(u, math.log(1.0 / (1.0 - confidence)), anytime=anytime))
    return lo + (hi - lo) * unit


def lower_bounds(
    x, lo: float, hi: float, confidence: float, *, anytime: bool = False
) -> np.ndarray:
    """:func:`lower_bound` for each row of ``x`` ``[R, n]`` (independent samples), vectorised."""
    check_in_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] == 0:
        raise InvalidParameterError(f"x is invalid: must be [rows, n] with n >= 1, got {x.shape}")
    if np.any(x < lo) or np.any(x > hi):
        raise InvalidParameterError(
            f"x is invalid: observations leave the stated support [{lo}, {hi}]"
        )
    with jax.enable_x64(True):
        u = jnp.asarray((x - lo) / (hi - lo), jnp.float64)
        log_inv = math.log(1.0 / (1.0 - confidence))
        unit = jax.vmap(lambda row: _lower_unit(row, log_inv, anytime=anytime))(u)
        unit = np.asarray(unit)
    return lo + (hi - lo) * unit


class SequenceState(NamedTuple):
    """The state of a streamed betting confidence sequence over a fixed grid of candidate means.

    Attributes:
      grid: ``[G]`` candidate means on the unit scale, increasing (fixed before any data is seen).
      log_capital: ``[G]`` log K_t at each candidate (float64).
      count: Observations so far.
      sum_u: Their sum (unit scale).
      sum_sq: Sum of squared deviations from the running means (WSR eq. (27)).
      lower: The running maximum of the certified lower bound (unit scale).

    """

    grid: np.ndarray
    log_capital: np.ndarray
    count: float
    sum_u: float
    sum_sq: float
    lower: float


def sequence_init(grid_unit: np.ndarray) -> SequenceState:
    """A confidence sequence over the candidate means ``grid_unit`` (unit scale, values in (0, 1])."""
    grid = np.unique(np.clip(np.asarray(grid_unit, np.float64), 1e-12, 1.0))
    return SequenceState(grid, np.zeros_like(grid), 0.0, 0.0, 0.0, 0.0)


@jax.jit
def _chunk_update(u, grid, count, sum_u, sum_sq, log_inv_delta):
    lam = _bets(u, None, log_inv_delta, True, (count, sum_u, sum_sq))
    inc = jax.vmap(lambda m: _log_capital(u, lam, m))(grid)
    idx = jnp.arange(u.shape[-1], dtype=u.dtype)
    t = count + idx + 1.0
    mu_i = (0.5 + sum_u + jnp.cumsum(u)) / (t + 1.0)
    return inc, jnp.sum(u), jnp.sum((u - mu_i) ** 2)


def sequence_update(state: SequenceState, u_chunk, confidence: float) -> SequenceState:
    """Feeds the next observations (unit scale, in order) and updates the running lower bound."""
    u_chunk = np.asarray(u_chunk, np.float64).ravel()
    if u_chunk.size == 0:
        return state
    log_inv_delta = math.log(1.0 / (1.0 - confidence))
    with jax.enable_x64(True):
        inc, s, sq = _chunk_update(
            jnp.asarray(u_chunk),
            jnp.asarray(state.grid),
            state.count,
            state.sum_u,
            state.sum_sq,
            log_inv_delta,
        )
        inc, s, sq = np.asarray(inc), float(s), float(sq)
    log_capital = state.log_capital + inc
    rejected = log_capital >= log_inv_delta
    # K_t is non-increasing in m, so the rejected candidates form a prefix of the grid.
    prefix = int(np.argmin(rejected)) if not rejected.all() else rejected.size
    lower = max(state.lower, float(state.grid[prefix - 1]) if prefix > 0 else 0.0)
    return SequenceState(
        state.grid,
        log_capital,
        state.count + u_chunk.size,
        state.sum_u + s,
        state.sum_sq + sq,
        lower,
    )
