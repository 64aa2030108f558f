"""Minibatch indices drawn inside the compiled training loop, the same bits as ``jax.random``'s.

The Threefry-2x32 hash as unrolled uint32 arithmetic (traceable, cheap inside ``lax.scan``),
:func:`fold_in2` and :func:`minibatch_indices`: a training step's P and Q minibatches from its key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) as uint32 array arithmetic, unrolled (traceable).

    The words JAX's ``threefry2x32`` gives (``keys.threefry2x32`` is the same on the host). JAX lowers
    its primitive on CPU as a loop of five blocks, several compiled kernels per call; unrolled, XLA
    fuses a chain of calls into a few elementwise kernels, which halves the kernels of the training
    program (its compile time on a CPU).
    """
    u32 = jnp.uint32
    ks = (k1, k2, k1 ^ k2 ^ u32(0x1BD11BDA))
    a, b = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            a = a + b
            b = jax.lax.shift_left(b, u32(r)) | jax.lax.shift_right_logical(b, u32(32 - r))
            b = a ^ b
        a = a + ks[(i + 1) % 3]
        b = b + ks[(i + 2) % 3] + u32(i + 1)
    return a, b


def _unrolled_prng(key) -> bool:
    """Whether :func:`fold_in2` and :func:`minibatch_indices` may hash JAX's keys themselves.

    For threefry keys under partitionable threefry (JAX's default) and 32-bit integers: the layout
    their words follow here. Otherwise they call ``jax.random``.
    """
    return (
        str(jax.random.key_impl(key)) == "threefry2x32"
        and bool(jax.config.jax_threefry_partitionable)
        and not jax.config.jax_enable_x64
    )


def fold_in2(key, a, b):
    """``jax.random.fold_in(jax.random.fold_in(key, a), b)`` for ``a, b >= 0`` (traceable)."""
    if not _unrolled_prng(key):
        return jax.random.fold_in(jax.random.fold_in(key, a), b)
    words = jax.random.key_data(key)
    zero = jnp.zeros((), jnp.uint32)
    k1, k2 = _threefry(words[0], words[1], zero, jnp.asarray(a).astype(jnp.uint32))
    k1, k2 = _threefry(k1, k2, zero, jnp.asarray(b).astype(jnp.uint32))
    return jax.random.wrap_key_data(jnp.stack([k1, k2]), impl="threefry2x32")


def minibatch_indices(key, batch_size: int, n_p, n_q):
    """The minibatch rows of one step: ``randint(kp, (batch_size,), 0, n_p)``, the same of ``kq``.

    ``kp, kq = jax.random.split(key)``; int32 indices; traceable. The same bits as those calls (``tests/test_training.py`` compares them): ``randint`` draws two
    32-bit words per index, from the two halves of a split of its key, and reduces them modulo the
    span.
    """
    if not _unrolled_prng(key):
        kp, kq = jax.random.split(key)
        return (
            jax.random.randint(kp, (batch_size,), 0, n_p),
            jax.random.randint(kq, (batch_size,), 0, n_q),
        )
    u32 = jnp.uint32
    words = jax.random.key_data(key)
    pair = jnp.arange(2, dtype=u32)
    # split(key) -> (kp, kq); split(kp) and split(kq) -> the four keys of the four draws.
    a, b = _threefry(words[0], words[1], jnp.zeros(2, u32), pair)
    a, b = _threefry(a[:, None], b[:, None], jnp.zeros((2, 2), u32), pair[None, :])
    a, b = a.reshape(4, 1), b.reshape(4, 1)
    x, y = _threefry(a, b, jnp.zeros((4, batch_size), u32), jnp.arange(batch_size, dtype=u32)[None])
    bits = x ^ y  # rows: high and low words of P's draw, then of Q's

    def reduce(high, low, n):
        n = jnp.asarray(n, jnp.int32)
        span = jnp.where(n <= 0, u32(1), n.astype(u32))
        multiplier = jax.lax.rem(u32(1 << 16), span)
        multiplier = jax.lax.rem(multiplier * multiplier, span)
        offset = jax.lax.rem(high, span) * multiplier + jax.lax.rem(low, span)
        return jax.lax.rem(offset, span).astype(jnp.int32)

    return reduce(bits[0], bits[1], n_p), reduce(bits[2], bits[3], n_q)
