"""A user's own batch sampler inside :class:`~cbdp_jax._src.training_auditor.batch_sampling.BatchSampler`.

The training a user runs includes their data pipeline, so the audit takes it as it is: a function
``function(key, step, n)`` of the run's batch key (a typed key), the step t (a traced int32) and the
number of slots n (a Python int) that returns the step's batch, traceable by JAX, either

* indices ``[b]`` (an integer array of static length b): entries in [0, n) are examples (a repeated
  index is that example twice), anything else (e.g. -1) an empty slot; or
* a mask ``[n]`` bool: the examples in the batch (at most ``batch_size`` of them are kept; the rest
  are counted in the batch's ``overflow``).

The sampler sees every slot. Slots the audit marks absent (the add/remove neighbour's canary, a
one-run audit's excluded canaries: slots ``size .. n - 1``) are dropped from what it returns, so an
absent example is in no batch. For a sampler whose examples are included independently (Poisson),
that is exactly its law on the present examples; for a fixed-size or shuffled one it is the batch
of the full data set less the absent examples, which is how a pipeline that filters records after
batching behaves. The accountant is told ``rate`` (default ``batch_size / n``), so a fixed-size or
shuffled sampler accounted as Poisson is audited against the Poisson claim it makes.

References:
  Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang 2024, "How private are DP-SGD
  implementations?" (shuffled batches accounted as Poisson).

"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from cbdp_jax._src.infra.validation import InvalidParameterError, check_in_range, check_int_at_least


def check(sampler: Any) -> None:
    """Checks a ``'custom'`` sampler's fields (the function itself is checked on first use)."""
    if sampler.kind != "custom":
        raise InvalidParameterError(
            f"sampler={sampler.kind!r} is invalid with a function: give kind='custom'"
        )
    if not callable(sampler.function):
        raise InvalidParameterError(
            "function is invalid: a custom sampler needs function(key, step, n) -> batch indices "
            "[b] or mask [n]"
        )
    if sampler.rate is not None:
        check_in_range("rate", sampler.rate, 0.0, 1.0, low_open=True)
    if sampler.batch_size is not None:
        check_int_at_least("batch_size", sampler.batch_size, 1)
    if sampler.rate is None and sampler.batch_size is None:
        raise InvalidParameterError(
            "rate=None is invalid for a custom sampler without batch_size: give the q it is "
            "accounted at (rate) or its batch size (then q = batch_size / n)"
        )


def _shape(sampler: Any, n: int) -> jax.ShapeDtypeStruct:
    """What the user's function returns for ``n`` slots (traced once, abstractly)."""
    try:
        out = jax.eval_shape(
            lambda k, t: sampler.function(k, t, n), jax.random.key(0), jnp.int32(0)
        )
    except Exception as exc:  # noqa: BLE001 - any failure of the user's function
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InvalidParameterError(
            f"function is invalid: function(key, step, {n}) raised {type(exc).__name__}: {first}"
        ) from exc
    if not hasattr(out, "shape") or out.ndim != 1:
        raise InvalidParameterError(
            f"function is invalid: it returned {out!r}; must return indices [b] or a mask [{n}]"
        )
    is_mask = out.dtype == jnp.bool_
    if is_mask and out.shape != (n,):
        raise InvalidParameterError(
            f"function is invalid: its mask has shape {out.shape}, must be [{n}] (one per slot)"
        )
    if not is_mask and not jnp.issubdtype(out.dtype, jnp.integer):
        raise InvalidParameterError(
            f"function is invalid: it returned {out.dtype} [{out.shape[0]}]; must return integer "
            f"indices [b] or a bool mask [{n}]"
        )
    return out


def check_size(sampler: Any, n: int, what: str) -> None:
    """Raises unless the function draws a batch from ``n`` slots."""
    if n < 1:
        raise InvalidParameterError(
            f"examples={n} is invalid: a data set needs at least 1 ({what})"
        )
    _shape(sampler, n)


def rate(sampler: Any, n: int) -> float:
    """The q the sampler is accounted at: ``rate``, else ``batch_size / n``."""
    return float(sampler.rate) if sampler.rate is not None else min(1.0, sampler.batch_size / n)


def capacity(sampler: Any, n: int) -> int:
    """Slots a batch holds: the indices' length, or for a mask ``batch_size`` (else a Poisson cap)."""
    out = _shape(sampler, n)
    if out.dtype != jnp.bool_:
        return int(out.shape[0])
    if sampler.batch_size is not None:
        return min(n, int(sampler.batch_size))
    qn = rate(sampler, n) * n
    return min(n, math.ceil(qn + 8.0 * math.sqrt(qn) + 8.0))


def batch(sampler: Any, key: jax.Array, t, n: int, size, cap: int):
    """Step t's batch ``(indices [cap] int32, valid [cap] bool, overflow [])``, absent slots dropped."""
    out = sampler.function(key, jnp.asarray(t, jnp.int32), n)
    none = jnp.zeros((), jnp.int32)
    if out.dtype == jnp.bool_:
        mask = out & (jnp.arange(n) < size)
        (idx,) = jnp.nonzero(mask, size=cap, fill_value=n)
        overflow = (jnp.sum(mask) > cap).astype(jnp.int32)
    else:
        idx, overflow = out.astype(jnp.int32), none
    valid = (idx >= 0) & (idx < size)
    return jnp.where(valid, idx, 0).astype(jnp.int32), valid, overflow
