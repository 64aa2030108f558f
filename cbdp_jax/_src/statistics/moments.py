"""Sample moments as a mergeable pytree: count, mean, centred sum of squares, minimum and maximum.

A held-out evaluation streams its samples in chunks (and a sweep over members and devices); each chunk
contributes its :class:`Moments` and :func:`merge` combines two of them exactly (Chan, Golub and
LeVeque's parallel update of the mean and the centred sum of squares), so the result does not depend on
how the sample was cut. The fields are arrays of any common shape (a leading member axis in sweeps), so
the same functions run inside ``jit`` / ``vmap`` (JAX arrays) and on the host in float64 (NumPy
arrays): :func:`merge` uses only arithmetic and the ``minimum`` / ``maximum`` of the inputs' own array
library.

References:
  Chan, Golub, LeVeque, "Updating formulae and a pairwise algorithm for computing sample variances",
  COMPSTAT 1982. docs/theory/bounds.md, section "Moments".

"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Moments(NamedTuple):
    """Moments of a sample (or of a batch of samples: every field has the same shape).

    Attributes:
      count: Number of observations (float, so that merges stay in one dtype).
      mean: Sample mean (0 for an empty sample).
      m2: Centred sum of squares, sum_i (x_i - mean)^2.
      lo: Smallest observation (+inf for an empty sample).
      hi: Largest observation (-inf for an empty sample).

    """

    count: Any
    mean: Any
    m2: Any
    lo: Any
    hi: Any

    @property
    def variance(self):
        """The unbiased sample variance m2 / (count - 1); +inf with fewer than two observations."""
        xp = _xp(self.m2)
        safe = xp.where(self.count > 1, self.count - 1, 1)
        return xp.where(self.count > 1, self.m2 / safe, xp.inf)

    @property
    def std_error(self):
        """The standard error of the mean, sqrt(variance / count)."""
        xp = _xp(self.m2)
        return xp.sqrt(self.variance / xp.maximum(self.count, 1))


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np


def empty(shape: tuple[int, ...] = (), dtype=np.float64) -> Moments:
    """The moments of an empty sample (the identity of :func:`merge`), as NumPy arrays."""
    z = np.zeros(shape, dtype)
    return Moments(z, z, z, np.full(shape, np.inf, dtype), np.full(shape, -np.inf, dtype))


def of(x: jax.Array, mask: jax.Array | None = None, axis: int = -1) -> Moments:
    """The moments of ``x`` along ``axis`` (only the entries where ``mask`` is True). Traceable.

    Args:
      x: Observations, e.g. ``[n]`` or ``[members, n]``.
      mask: Boolean array broadcastable to ``x``; False entries are ignored (padding of a last chunk).
      axis: The sample axis.

    Returns:
      :class:`Moments` with the sample axis reduced.

    """
    x = jnp.asarray(x)
    mask = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(mask, x.shape)
    return _reduced(jnp, x, mask, axis)


def of_host(x, axis: int | None = None) -> Moments:
    """:func:`of` of a host sample, in float64 NumPy, without a device program.

    For validation-side decisions that evaluate many small samples, where a device call per sample
    costs more than the arithmetic. The same fields by the same formulas; sums in NumPy's order, so the
    last bits may differ from :func:`of`.

    Args:
      x: Observations.
      axis: The sample axis (one sample per row of ``[K, n]`` with ``axis=-1``: each row's moments
        are bit for bit those of the row alone); None: the whole of ``x`` flattened.

    """
    x = np.ascontiguousarray(x, np.float64)
    if axis is None:
        x, axis = x.ravel(), -1
    return _reduced(np, x, None, axis)


def _reduced(xp, x, mask, axis: int) -> Moments:
    """The fields of :class:`Moments` along ``axis`` in ``xp`` (jax.numpy, traceable; or NumPy).

    ``mask=None`` (NumPy only) counts every entry without the masking passes: a ``where`` of an all-true
    mask is a contiguous copy of ``x``, so for a contiguous ``x`` the fields are bit for bit those of an
    all-true mask (``tests/test_statistics.py``).
    """
    keep = (lambda v, fill: v) if mask is None else (lambda v, fill: xp.where(mask, v, fill))
    total = xp.sum(keep(x, 0), axis=axis)
    if mask is None:
        count = np.full(np.shape(total), x.shape[axis], x.dtype)[()]
    else:
        count = xp.sum(mask, axis=axis).astype(x.dtype)
    mean = total / xp.maximum(count, 1)
    # An infinite observation makes x - mean NaN (inf - inf); m2 is then set to +inf, so NumPy need
    # not warn (the errstate is a no-op for traced arrays).
    with np.errstate(invalid="ignore"):
        centred = keep(x - xp.expand_dims(mean, axis), 0)
        m2 = _infinite_where_mean_is(xp, mean, xp.sum(centred * centred, axis=axis))
    return Moments(
        count,
        mean,
        m2,
        # ``initial``: an empty sample's min is +inf, its max -inf (NumPy refuses an empty reduction).
        xp.min(keep(x, xp.inf), axis=axis, initial=xp.inf),
        xp.max(keep(x, -xp.inf), axis=axis, initial=-xp.inf),
    )


def merge(a: Moments, b: Moments) -> Moments:
    """The moments of the union of two disjoint samples (Chan's parallel update).

    Exact in real arithmetic, elementwise over batched fields; either side may be empty, and an empty
    side leaves the other unchanged bit for bit. A side with an infinite mean (an observation that
    overflowed, e.g. a float32 critic's f*(h)) makes the union's mean infinite and its centred sum of
    squares +inf, never NaN (the update's ``delta`` is only formed from two finite means); the mean of
    a union of a +inf and a -inf mean is NaN, as it is undefined.
    """
    xp = _xp(a.mean) if _xp(b.mean) is np else jnp
    total = a.count + b.count
    safe = xp.where(total > 0, total, 1)
    finite = xp.isfinite(a.mean) & xp.isfinite(b.mean)
    delta = xp.where(finite, b.mean, 0) - xp.where(finite, a.mean, 0)
    both = finite & (a.count > 0) & (b.count > 0)
    mean = xp.where(both, a.mean + delta * (b.count / safe), a.mean + b.mean)
    m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / safe)
    m2 = _infinite_where_mean_is(xp, mean, xp.where(b.count > 0, m2, a.m2))
    return Moments(
        total,
        xp.where(total > 0, mean, 0),
        xp.where(total > 0, m2, 0),
        xp.minimum(a.lo, b.lo),
        xp.maximum(a.hi, b.hi),
    )


def _infinite_where_mean_is(xp, mean, m2):
    """``m2`` where ``mean`` is finite, +inf where it is not (a sample with an infinite observation)."""
    return xp.where(xp.isfinite(mean), m2, xp.inf)


def to_host(m: Moments) -> Moments:
    """The moments as float64 NumPy arrays (gathered from devices), ready for host-side merging."""
    return Moments(*(np.asarray(jax.device_get(f), np.float64) for f in m))


def take(m: Moments, index) -> Moments:
    """One member (or a slice) of batched moments."""
    return Moments(*(f[index] for f in m))
