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
