"""Typed PRNG keys made, split and folded on the host: the same bits as JAX's, with no program.

An eager ``jax.random.key``, ``split`` or ``fold_in`` compiles a small program of its own (and unpacking a
split key another): a first call in a fresh process compiles each, and a program store must load each
again in the next process. The default key implementation, threefry2x32, is a hash of 32-bit words that
NumPy computes in microseconds for the few words a key needs, so these functions compute the key words
on the host (:func:`threefry2x32`, the rounds of Salmon et al. as JAX lowers them) and wrap them as typed
keys (``jax.random.wrap_key_data``, which runs nothing). They give the same keys as the eager calls
(``tests/test_keys.py`` compares them with JAX's, under either setting of ``jax_threefry_partitionable``);
a key of another implementation, or a value outside the range handled here, is passed to JAX.

References:
  Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (Threefry-2x32,
  20 rounds). JAX's ``jax/_src/random/threefry2x32.py`` (the key schedule, the seed and the counters).

"""

from __future__ import annotations

import math

import jax
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
_IMPL = "threefry2x32"


def threefry2x32(k1, k2, x1: np.ndarray, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of the counter words ``(x1, x2)`` under the key ``(k1, k2)``.

    Elementwise over ``x1``, ``x2`` (uint32 arrays of one shape); the words JAX's ``threefry2x32``
    primitive gives. NumPy's uint32 arithmetic wraps modulo 2^32, as the hash needs.
    """
    ks = (np.uint32(k1), np.uint32(k2), np.uint32(k1) ^ np.uint32(k2) ^ _PARITY)
    a = np.add(np.asarray(x1, np.uint32), ks[0])
    b = np.add(np.asarray(x2, np.uint32), ks[1])
    t = np.empty_like(b)
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            np.add(a, b, out=a)
            np.left_shift(b, np.uint32(r), out=t)
            np.right_shift(b, np.uint32(32 - r), out=b)
            np.bitwise_or(b, t, out=b)
            np.bitwise_xor(b, a, out=b)
        np.add(a, ks[(i + 1) % 3], out=a)
        np.add(b, np.uint32((int(ks[(i + 2) % 3]) + i + 1) & 0xFFFFFFFF), out=b)
    return a, b


def _words(key: jax.Array) -> np.ndarray | None:
    """The uint32 words ``[..., 2]`` of a concrete threefry key array, else None.

    None for a traced key or another implementation: JAX's own functions handle those.
    """
    if isinstance(key, jax.core.Tracer) or str(jax.random.key_impl(key)) != _IMPL:
        return None
    return np.asarray(jax.random.key_data(key), np.uint32)


def _wrap(words: np.ndarray) -> jax.Array:
    return jax.random.wrap_key_data(np.ascontiguousarray(words, np.uint32), impl=_IMPL)


def _hash_counts(words: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The two output words of hashing the counters ``0 .. count - 1`` (JAX's iota, either layout).

    Partitionable threefry hashes the 64-bit counter ``i`` as the word pair ``(0, i)``; the original
    layout hashes the flat iota cut in two halves (padded with a zero word to an even length).
    """
    k1, k2 = words[0], words[1]
    if jax.config.jax_threefry_partitionable:
        return threefry2x32(k1, k2, np.zeros(count, np.uint32), np.arange(count, dtype=np.uint32))
    flat = np.arange(count + count % 2, dtype=np.uint32)
    if count % 2:
        flat[-1] = 0
    half = flat.size // 2
    a, b = threefry2x32(k1, k2, flat[:half], flat[half:])
    return a, b


def _split_words(words: np.ndarray, num: int) -> np.ndarray:
    """``num`` child keys' words ``[num, 2]`` (``jax.random.split``)."""
    if jax.config.jax_threefry_partitionable:
        a, b = _hash_counts(words, num)
        return np.stack([a, b], axis=-1)
    a, b = _hash_counts(words, 2 * num)
    return np.concatenate([a, b]).reshape(num, 2)


def from_seed(seed: int) -> jax.Array:
    """``jax.random.key(seed)``: computed on the host for seeds in ``[0, 2^31)``."""
    if not (0 <= int(seed) < 2**31) or str(jax.config.jax_default_prng_impl) != _IMPL:
        return jax.random.key(seed)
    return _wrap(np.array([0, int(seed)], np.uint32))


def split(key: jax.Array, *, num: int = 2) -> tuple[jax.Array, ...]:
    """``tuple(jax.random.split(key, num))``: ``num`` new keys, ready to unpack."""
    words = _words(key) if key.shape == () else None
    if words is None:
        return tuple(jax.random.split(key, num))
    return tuple(_wrap(w) for w in _split_words(words, num))


def split_array(key: jax.Array, *, num: int) -> jax.Array:
    """``jax.random.split(key, num)``: ``num`` new keys as one array (one per ensemble member)."""
    words = _words(key) if key.shape == () else None
    if words is None:
        return jax.random.split(key, num)
    return _wrap(_split_words(words, num))


def fold_in(key: jax.Array, data) -> jax.Array:
    """``jax.random.fold_in(key, data)`` (on the host for ``0 <= data < 2^32``)."""
    words = _words(key) if key.shape == () else None
    if words is None or not (0 <= int(data) < 2**32):
        return jax.random.fold_in(key, data)
    # JAX hashes the seed words of ``data``, (0, data), as one two-word counter.
    a, b = threefry2x32(words[0], words[1], np.zeros(1, np.uint32), np.array([data], np.uint32))
    return _wrap(np.array([a[0], b[0]], np.uint32))


def bits(key: jax.Array, n: int) -> np.ndarray:
    """``np.asarray(jax.random.bits(key, (n,), jnp.uint32))``, computed on the host."""
    words = _words(key)
    if words is None:
        return np.asarray(jax.random.bits(key, (n,), np.uint32))
    a, b = _hash_counts(words, n)
    if jax.config.jax_threefry_partitionable:
        return a ^ b
    return np.concatenate([a, b])[:n]


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
    indices. This draws the same keys (:func:`split`, :func:`bits`) and sorts them by radix on the
    host: about 0.2 s. ``tests/test_keys.py`` checks the indices against JAX's, one to three rounds.
    """
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(np.iinfo(np.uint32).max))
    x = np.arange(n)
    for _ in range(rounds):
        key, sub = split(key)
        x = x[_stable_argsort_u32(bits(sub, n))]
    return x


__all__ = ["bits", "fold_in", "from_seed", "permutation", "split", "split_array", "threefry2x32"]
