"""Is the variance finite? A streaming sketch of the largest deviations and Hill's tail index.

The asymptotic (CLT) bound needs both f-form terms, h(X) under P and f*(h(Y)) under Q, to have finite
variance. Whether they do is a property of the tails: a term whose survival function decays like
x^(-k) has finite moments of order < k only, and finite variance needs k > 2. The classic failure
(docs/theory/bounds.md, "Heavy tails"): for Laplace noise and a linear KL critic h = a x + b, exp(h)
under Q has tail index eps / a, below 2 for every eps >= 4/3 at the optimal slope; the sample variance
then underestimates the spread and the CLT bound is too high far more often than its level says.

Hill's estimator of the tail index alpha of a positive sample from its k + 1 largest values
y_(1) >= ... >= y_(k+1) is  1 / mean_{i <= k} log(y_(i) / y_(k+1))  (exact for Pareto tails, consistent
for regularly varying ones as k -> inf, k / n -> 0). We apply it to |t - c|, c a centre fixed on
validation data, so that either tail of a term counts; for light tails (exponential, Gaussian) the
estimate is large and grows with n, so a rule "refuse when the estimate is below 2 + margin" only bites
on tails that really are polynomial. The sketch keeps the ``capacity`` largest deviations seen so far:
chunk sketches merge by taking the largest of both, so the index of a streamed sample equals that of
the whole sample.

References:
  Hill, "A simple general approach to inference about the tail of a distribution", Annals of
  Statistics 3 (1975). docs/theory/bounds.md, "Heavy tails".

"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_CAPACITY = 4096


class TailSketch(NamedTuple):
    """The largest absolute deviations from a fixed centre seen so far, in decreasing order.

    Attributes:
      top: ``[..., capacity]`` largest |x - centre| values (``-inf`` where fewer were seen).
      count: ``[...]`` number of observations summarised.

    """

    top: Any
    count: Any


def top_values(x: jax.Array, k: int) -> jax.Array:
    """The ``k`` largest entries along the last axis, in decreasing order (``lax.top_k``'s values).

    XLA's CPU backend runs ``top_k`` as a partial selection only when the result has one user; sliced
    twice (e.g. the k largest and the (k + 1)-th, as Hill's estimator does), it falls back to a full
    sort of the operand, 10 times slower at 256 values (measured in the sweep's training program). The
    optimisation barrier keeps the result whole, so the selection stays. The values are the same.
    """
    return jax.lax.optimization_barrier(jax.lax.top_k(x, k)[0])


def sketch(x: jax.Array, centre, capacity: int, mask: jax.Array | None = None) -> TailSketch:
    """The sketch of one sample ``x`` ``[..., n]`` (entries where ``mask`` is False ignored). Traceable."""
    x = jnp.asarray(x)
    dev = jnp.abs(x - jnp.expand_dims(jnp.asarray(centre, x.dtype), -1))
    if mask is not None:
        dev = jnp.where(jnp.broadcast_to(mask, x.shape), dev, -jnp.inf)
        count = jnp.sum(jnp.broadcast_to(mask, x.shape), axis=-1).astype(x.dtype)
    else:
        count = jnp.full(x.shape[:-1], x.shape[-1], x.dtype)
    k = min(capacity, x.shape[-1])
    top = top_values(dev, k)
    if k < capacity:
        pad = jnp.full(top.shape[:-1] + (capacity - k,), -jnp.inf, top.dtype)
        top = jnp.concatenate([top, pad], axis=-1)
    return TailSketch(top, count)


def merge(a: TailSketch, b: TailSketch) -> TailSketch:
    """The sketch of the union of two samples (host NumPy or traced JAX arrays)."""
    capacity = a.top.shape[-1]
    if isinstance(a.top, jax.Array) or isinstance(b.top, jax.Array):
        both = jnp.concatenate([jnp.asarray(a.top), jnp.asarray(b.top)], axis=-1)
        return TailSketch(top_values(both, capacity), a.count + b.count)
    both = np.concatenate([np.asarray(a.top), np.asarray(b.top)], axis=-1)
    return TailSketch(-np.sort(-both, axis=-1)[..., :capacity], a.count + b.count)


def empty(capacity: int = DEFAULT_CAPACITY, shape: tuple[int, ...] = ()) -> TailSketch:
    """The sketch of an empty sample, as NumPy arrays."""
    return TailSketch(np.full(shape + (capacity,), -np.inf), np.zeros(shape))


def default_k(n: int, capacity: int = DEFAULT_CAPACITY) -> int:
    """The number of order statistics Hill's estimator uses for a sample of size n: about sqrt(n)."""
    return int(min(max(math.ceil(math.sqrt(max(n, 1))), 10), capacity - 1, max(n // 10, 1)))


class TailIndex(NamedTuple):
    """Hill's estimate of a tail index and what it says about the variance.

    Attributes:
      index: The estimate (``inf`` when the k + 1 largest deviations are all equal, e.g. a bounded
        or discrete sample whose extremes tie; ``nan`` never).
      k: Order statistics used.
      std_error: The estimate's asymptotic standard error, index / sqrt(k).

    """

    index: float
    k: int
    std_error: float


def hill(s: TailSketch, k: int | None = None) -> TailIndex:
    """Hill's tail-index estimate from a (host) sketch, with k = :func:`default_k` by default."""
    top = np.asarray(s.top, np.float64)
    n = int(np.asarray(s.count))
    k = default_k(n, top.shape[-1]) if k is None else int(k)
    y = top[: k + 1]
    if y.size < k + 1 or not np.all(np.isfinite(y)) or k < 1:
        return TailIndex(math.inf, k, math.inf)
    threshold = y[k]
    if threshold <= 0:
        # More than n - k deviations are exactly 0: an atom at the centre; use the positive part.
        positive = y[y > 0]
        if positive.size < 3:
            return TailIndex(math.inf, k, math.inf)
        y, k, threshold = positive, positive.size - 1, positive[-1]
    gamma = float(np.mean(np.log(y[:k] / threshold)))
    if gamma <= 0:
        return TailIndex(math.inf, k, math.inf)
    index = 1.0 / gamma
    return TailIndex(index, k, index / math.sqrt(k))


def hill_lower_traced(t: jax.Array, centre, k: int, z: float) -> jax.Array:
    """Hill's index of |t - centre| on its k + 1 largest values, minus z index / sqrt(k). Traceable.

    :func:`hill`'s index less z times its standard error, for a continuous sample inside a compiled
    program (the sweep's tail shrink). A sample whose k + 1 largest deviations tie or vanish (no tail to
    estimate) gets an infinite index, as there; unlike there, an atom at the centre is not set aside.
    """
    y = top_values(jnp.abs(t - centre), k + 1)
    threshold = y[k]
    safe = jnp.where(threshold > 0, threshold, 1.0)
    gamma = jnp.mean(jnp.log(jnp.where(threshold > 0, y[:k], 1.0) / safe))
    index = jnp.where(
        (threshold > 0) & (gamma > 0), 1.0 / jnp.where(gamma > 0, gamma, 1.0), jnp.inf
    )
    return index * (1.0 - z / math.sqrt(k))
