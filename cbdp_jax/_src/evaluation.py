"""Held-out evaluation of one fixed adversary: the plain f-form, its standard error and a lower bound.

For a fixed h (trained elsewhere) and independent held-out samples x_1..x_n ~ P, y_1..y_m ~ Q, the value
mean(h(x_i)) - mean(f*(h(y_j))) is an unbiased estimate of E_P[h] - E_Q[f*(h)] <= D_f^H (MATH.md section
9). Its variance is Var_P(h)/n + Var_Q(f*(h))/m, and the one-sided (1 - delta) bound
estimate - z_{1-delta} * SE is an asymptotic (CLT) lower confidence bound on D_f^H.

Evaluation streams over chunks, so the number of held-out samples is limited by time, not memory: each
chunk contributes its count, mean and centred sum of squares, combined on the host in float64 with Chan's
parallel update.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.training import TRACE_COUNT, ObjectiveKey, apply_fn


class Moments(NamedTuple):
    """Running count, mean, centred sum of squares, min and max (float64, host side)."""

    n: int
    mean: float
    m2: float
    lo: float
    hi: float

    @staticmethod
    def empty() -> Moments:
        return Moments(0, 0.0, 0.0, math.inf, -math.inf)

    def merge(self, n: int, mean: float, m2: float, lo: float, hi: float) -> Moments:
        if n == 0:
            return self
        if self.n == 0:
            return Moments(n, mean, m2, lo, hi)
        total = self.n + n
        delta = mean - self.mean
        return Moments(
            total,
            self.mean + delta * n / total,
            self.m2 + m2 + delta * delta * self.n * n / total,
            min(self.lo, lo),
            max(self.hi, hi),
        )

    @property
    def variance(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else math.inf


@functools.partial(jax.jit, static_argnames=("graphdef", "objective_key", "side"))
def _chunk_stats(
    params, rest, scale, shift, x, *, graphdef, objective_key: ObjectiveKey, side: str
):
    TRACE_COUNT["evaluate"] += 1
    div, _ = objective_key.build()
    h = scale * apply_fn(graphdef, params, rest, x) + shift
    terms = h if side == "p" else div.conjugate(h)
    mean = jnp.mean(terms)
    m2 = jnp.sum((terms - mean) ** 2)
    return mean, m2, jnp.min(terms), jnp.max(terms)


def accumulate(chunks: Iterator[jax.Array], stats_fn: Callable[[jax.Array], tuple]) -> Moments:
    """Streams chunks through ``stats_fn`` and merges their moments in float64."""
    acc = Moments.empty()
    for x in chunks:
        mean, m2, lo, hi = (float(v) for v in stats_fn(x))
        acc = acc.merge(int(x.shape[0]), mean, m2, lo, hi)
    return acc


def array_chunks(x: jax.Array, chunk: int) -> Iterator[jax.Array]:
    """Yields consecutive row blocks of ``x`` of at most ``chunk`` rows."""
    for start in range(0, x.shape[0], chunk):
        yield x[start : start + chunk]


class HeldOut(NamedTuple):
    """Held-out moments of the two terms of the f-form."""

    p: Moments
    q: Moments

    @property
    def estimate(self) -> float:
        return self.p.mean - self.q.mean

    @property
    def std_error(self) -> float:
        return math.sqrt(self.p.variance / self.p.n + self.q.variance / self.q.n)

    def heavy_tail_share(self) -> float:
        """The largest single Q-term's share of the centred sum of squares of f*(h) under Q.

        Near 1/m for light tails; a share above a few percent means one sample carries the variance
        estimate, which is then unreliable (MATH.md section 9: f*(h) may have infinite variance).
        """
        q = self.q
        if q.m2 <= 0 or not math.isfinite(q.m2):
            return 0.0 if q.m2 == 0 else 1.0
        worst = max((q.hi - q.mean) ** 2, (q.lo - q.mean) ** 2)
        return worst / q.m2


def evaluate_fixed(
    params,
    rest,
    scale,
    shift,
    p_chunks: Iterator[jax.Array],
    q_chunks: Iterator[jax.Array],
    *,
    graphdef,
    objective_key: ObjectiveKey,
) -> HeldOut:
    """Evaluates the fixed function ``scale * h + shift`` on streamed held-out chunks."""
    p = accumulate(
        p_chunks,
        lambda x: _chunk_stats(
            params, rest, scale, shift, x, graphdef=graphdef, objective_key=objective_key, side="p"
        ),
    )
    q = accumulate(
        q_chunks,
        lambda x: _chunk_stats(
            params, rest, scale, shift, x, graphdef=graphdef, objective_key=objective_key, side="q"
        ),
    )
    return HeldOut(p, q)


def z_quantile(confidence: float) -> float:
    """The standard normal quantile z with P(Z <= z) = confidence."""
    return statistics.NormalDist().inv_cdf(confidence)


def point_mass_reason(p: np.ndarray, q: np.ndarray) -> str | None:
    """Detects the non-private release of MATH.md section 5 / paper Lemma 2.

    If both samples take at most a handful of distinct values and share none of them, P and Q are (up
    to sampling) distinct point masses or mutually singular discrete laws, and every divergence of a class
    containing linear functions is +inf. Returns the reason, or None.
    """
    up = np.unique(p, axis=0)
    uq = np.unique(q, axis=0)
    few = max(10, min(p.shape[0], q.shape[0]) // 100)
    if len(up) > few or len(uq) > few:
        return None
    shared = {tuple(r) for r in up.tolist()} & {tuple(r) for r in uq.tolist()}
    if shared:
        return None
    return (
        f"P and Q samples take {len(up)} and {len(uq)} distinct values with none in common: the laws are "
        "mutually singular (a non-private release), so the divergence is +inf for any class containing "
        "linear functions (paper Lemma 2)"
    )


HEAVY_TAIL_SHARE = 0.05
UNRELIABLE_SHARE = 0.5


def renyi_slope(div, f_value: float) -> float:
    """d(reported)/d(f-value): the delta-method factor for the Renyi map (1 for other divergences)."""
    if div.name != "renyi":
        return 1.0
    a = div.alpha
    denom = 1.0 + a * (a - 1.0) * f_value
    return a / denom if denom > 0 else math.inf


def to_reported(div, value: float) -> float:
    """Maps an f-scale value to the reported scale, passing +-inf through."""
    if math.isinf(value):
        return value
    return float(div.to_reported(value))


def summarize(
    div,
    held: HeldOut,
    *,
    z: float,
    contains_constants: bool,
    val_curve: np.ndarray | None = None,
) -> dict:
    """Turns held-out moments into the reported numbers and the warnings they call for.

    Args:
      div: The divergence.
      held: Held-out moments of the fixed function's two f-form terms.
      z: The normal quantile of the one-sided bound.
      contains_constants: Whether H contains constants (then D^H >= 0 and the bound is clamped at 0).
      val_curve: The selected adversary's validation objective per block (convergence check).

    Returns:
      A dict with ``estimate``, ``lower_bound``, ``std_error`` (reported scale), ``f_estimate``,
      ``f_lower_bound``, ``f_std_error``, ``bound_reliable``, ``heavy_tail_share`` and ``warnings``.
      When one held-out sample carries more than ``UNRELIABLE_SHARE`` of the variance of f*(h), the CLT
      bound is meaningless: ``bound_reliable`` is False and ``lower_bound`` falls back to the trivial
      bound (0 when H contains constants, else -inf), so no number that looks fine is reported.

    """
    warnings: list[str] = []
    overflow = not (math.isfinite(held.p.mean) and math.isfinite(held.p.m2))
    if overflow:
        warnings.append(
            "the adversary's outputs overflowed (non-finite) on held-out samples: no estimate; "
            "retry with dtype='float64' or a smaller learning rate"
        )
    f_est = held.estimate if math.isfinite(held.q.mean) and not overflow else -math.inf
    if not math.isfinite(f_est) and not overflow:
        if div.conjugate_sup < math.inf:
            warnings.append(
                "the trained adversary leaves the conjugate's domain on held-out samples: no estimate"
            )
        else:
            warnings.append(
                "f*(h) overflowed (non-finite) on held-out Q samples: no estimate; retry with "
                "dtype='float64', more samples or a smaller class"
            )
    f_se = held.std_error if math.isfinite(f_est) else math.inf
    f_lb = f_est - z * f_se if math.isfinite(f_est) else -math.inf
    est, lb = to_reported(div, f_est), to_reported(div, f_lb)
    se = f_se * renyi_slope(div, f_est) if math.isfinite(f_se) else math.inf
    share = held.heavy_tail_share() if math.isfinite(f_est) else 0.0
    reliable = share <= UNRELIABLE_SHARE
    if share > HEAVY_TAIL_SHARE:
        warnings.append(
            f"heavy tail: one held-out sample carries {share:.0%} of the variance of f*(h) under Q; "
            + (
                "the standard error may be underestimated and the bound optimistic"
                if reliable
                else "the variance estimate is unusable, so the confidence bound is replaced by the "
                "trivial bound"
            )
            + " (MATH.md section 9)"
        )
    if not reliable:
        lb = -math.inf
    if contains_constants:
        lb = max(lb, 0.0)
    n_min = min(held.p.n, held.q.n)
    if math.isfinite(est) and est > math.log(n_min):
        warnings.append(
            f"estimate {est:.3g} exceeds log(n_test) = {math.log(n_min):.3g}: divergences this large "
            "cannot be certified from this many samples (MATH.md section 9)"
        )
    if (
        val_curve is not None
        and len(val_curve) >= 4
        and math.isfinite(f_se)
        and np.all(np.isfinite(val_curve[-1 - max(len(val_curve) // 4, 1) :]))
    ):
        blocks = len(val_curve)
        tail = max(blocks // 4, 1)
        gain = float(val_curve[-1] - val_curve[-1 - tail])
        if np.argmax(val_curve) >= blocks - max(blocks // 10, 1) and gain > max(f_se, 1e-3):
            warnings.append(
                f"not converged: validation objective still rose by {gain:.3g} over the last {tail} "
                "evaluation blocks; increase steps"
            )
    return {
        "estimate": est,
        "lower_bound": lb,
        "std_error": se,
        "f_estimate": f_est,
        "f_lower_bound": f_lb,
        "f_std_error": f_se,
        "bound_reliable": reliable,
        "heavy_tail_share": share,
        "warnings": warnings,
    }
