"""Typed PRNG keys made, split and folded by stored programs rather than eager operations.

An eager ``jax.random.key``, ``split`` or ``fold_in`` compiles a small program of its own (and unpacking a
split key another), which every new process traces, lowers and looks up again: a dozen such programs
cost a cold ``cbdp estimate`` about a tenth of a second. These run one program each, kept on disk by
:mod:`~cbdp_jax._src.programs`; they give the same bits as the eager calls and inline inside a trace.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

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


@persistent_jit(static_argnames=("n",))
def _sort_keys(key: jax.Array, *, n: int) -> tuple[jax.Array, jax.Array]:
    """One round of ``jax.random.permutation``'s keys: the next key and n random 32-bit sort keys."""
    key, sub = jax.random.split(key)
    return key, jax.random.bits(sub, (n,), jnp.uint32)


def _stable_argsort_u32(bits: np.ndarray) -> np.ndarray:
    """``np.argsort(bits, kind='stable')`` for uint32 keys, in linear time.

    Two stable passes over the 16-bit halves, low then high: numpy sorts 16-bit keys by radix, while
    its stable sort of 32-bit keys is a merge sort, three times slower on 2 million keys.
    """
    order = np.argsort((bits & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((bits[order] >> 16).astype(np.uint16), kind="stable")]


def permutation(key: jax.Array, n: int) -> np.ndarray:
    """``np.asarray(jax.random.permutation(key, n))``, the same indices, computed on the host.

    JAX shuffles by ``ceil(3 log n / log(2^32 - 1))`` stable sorts of the indices by fresh random 32-bit
    keys (``jax/_src/random`` ``_shuffle``); on a CPU its sorts take about 1.6 s for 2.25 million
    indices. This draws the same keys (one stored program per round) and sorts them by radix on the
    host: about 0.2 s. ``tests/test_keys.py`` checks the indices against JAX's, one to three rounds.
    """
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(np.iinfo(np.uint32).max))
    x = np.arange(n)
    # Drawn for a power-of-two bucket of n and cut to n: threefry's bits are counter-based (the first
    # n of a longer draw are the draw of n), so one stored program serves every n in a bucket.
    rows = max(_MIN_BUCKET, 1 << max(n - 1, 0).bit_length())
    for _ in range(rounds):
        key, bits = _sort_keys(key, n=rows)
        x = x[_stable_argsort_u32(np.asarray(bits)[:n])]
    return x


_MIN_BUCKET = 1 << 16


__all__ = ["fold_in", "from_seed", "permutation", "split", "split_array"]
