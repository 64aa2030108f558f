"""Typed PRNG keys made, split and folded by stored programs rather than eager operations.

An eager ``jax.random.key``, ``split`` or ``fold_in`` compiles a small program of its own (and unpacking a
split key another), which every new process traces, lowers and looks up again: a dozen such programs
cost a cold ``cbdp estimate`` about a tenth of a second. These run one program each, kept on disk by
:mod:`~cbdp_jax._src.programs`; they give the same bits as the eager calls and inline inside a trace.
"""

from __future__ import annotations

import jax

from cbdp_jax._src.programs import persistent_jit


def from_seed(seed: int) -> jax.Array:
    """``jax.random.key(seed)`` (by a stored program for seeds in the int32 range)."""
    if -(2**31) <= int(seed) < 2**31:
        return _from_seed(seed)
    return jax.random.key(seed)


@persistent_jit
def _from_seed(seed) -> jax.Array:
    return jax.random.key(seed)


@persistent_jit(static_argnames=("num",))
def split(key: jax.Array, *, num: int = 2) -> tuple[jax.Array, ...]:
    """``tuple(jax.random.split(key, num))``: ``num`` new keys, ready to unpack."""
    return tuple(jax.random.split(key, num))


@persistent_jit(static_argnames=("num",))
def split_array(key: jax.Array, *, num: int) -> jax.Array:
    """``jax.random.split(key, num)``: ``num`` new keys as one array (one per ensemble member)."""
    return jax.random.split(key, num)


@persistent_jit
def fold_in(key: jax.Array, data) -> jax.Array:
    """``jax.random.fold_in(key, data)``."""
    return jax.random.fold_in(key, data)


__all__ = ["fold_in", "from_seed", "split", "split_array"]
