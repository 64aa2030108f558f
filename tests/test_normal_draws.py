"""Normal draws from both words of each Threefry block (cbdp_jax._src.training_auditor.normal_draws): the law of
``jax.random.normal``'s draws, half the hashes; the two words of a block independent; same key, same
draws. Statistical checks at level 1e-4 (each would fail once in 10^4 runs by chance); each has a
negative control that the same check rejects."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32
from scipy import stats

from cbdp_jax._src.training_auditor import normal_draws

LEVEL = 1e-4
M = 200_000


def test_words_are_both_halves_of_the_blocks():
    key = jax.random.key(11)
    words = np.asarray(normal_draws.uniform_words(key, 7))
    counts = jnp.stack([jnp.zeros(4, jnp.uint32), jnp.arange(4, dtype=jnp.uint32)])
    first, second = (np.asarray(a) for a in threefry_2x32(jax.random.key_data(key), counts))
    np.testing.assert_array_equal(words, np.concatenate([first, second])[:7])


def test_the_bits_go_through_jax_random_normals_own_transformation():
    """Fed jax.random.normal's own bits (the XOR of a block's words), the same floats, bit for bit."""
    key = jax.random.key(3)
    counts = jnp.arange(1000, dtype=jnp.uint32)
    a, b = threefry_2x32(jax.random.key_data(key), jnp.stack([jnp.zeros_like(counts), counts]))
    original = normal_draws.uniform_words
    try:
        normal_draws.uniform_words = lambda k, n: (a ^ b)[:n]
        ours = normal_draws.normal(key, (1000,))
    finally:
        normal_draws.uniform_words = original
    if jax.config.jax_threefry_partitionable:  # JAX's bits are those XORs in this mode only
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(jax.random.normal(key, (1000,))))


def test_draws_are_standard_normal():
    x = np.asarray(normal_draws.normal(jax.random.key(0), (M,)), np.float64)
    assert stats.kstest(x, "norm").pvalue > LEVEL
    # mean and variance within 4.5 standard errors (1/sqrt(M), sqrt(2/M)): two-sided level < 1e-5
    assert abs(x.mean()) < 4.5 / np.sqrt(M)
    assert abs(x.var() - 1.0) < 4.5 * np.sqrt(2.0 / M)
    # negative control: a standard deviation 2% too large is rejected by the same test
    assert stats.kstest(1.02 * x, "norm").pvalue < LEVEL


def test_the_two_words_of_a_block_and_two_keys_are_independent():
    half = M // 2
    x = np.asarray(normal_draws.normal(jax.random.key(1), (2 * half,)), np.float64)
    y = np.asarray(normal_draws.normal(jax.random.key(2), (2 * half,)), np.float64)
    # Pearson r of independent normals is N(0, 1/m) for large m: |r| < 3.9 / sqrt(m) at level 1e-4
    bound = 3.9 / np.sqrt(half)
    assert abs(np.corrcoef(x[:half], x[half:])[0, 1]) < bound  # word 1 against word 2, same blocks
    assert abs(np.corrcoef(x[:half], y[:half])[0, 1]) < bound
    # squares too (dependence without correlation), r of chi-square(1) pairs: variance 1/m as well
    assert abs(np.corrcoef(x[:half] ** 2, x[half:] ** 2)[0, 1]) < bound
    # negative control: the same check rejects dependent words (a copy)
    assert abs(np.corrcoef(x[:half], x[:half])[0, 1]) > bound


def test_words_fill_every_byte_evenly():
    words = np.asarray(normal_draws.uniform_words(jax.random.key(5), 2**18))
    for shift in (0, 8, 16, 24):
        counts = np.bincount((words >> shift) & 0xFF, minlength=256)
        assert stats.chisquare(counts).pvalue > LEVEL
    # negative control: a bit stuck at 0 in one byte is rejected
    stuck = np.bincount(((words >> 24) & 0xFE), minlength=256)
    assert stats.chisquare(stuck).pvalue < LEVEL


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5), (7,)])
def test_shapes_and_the_same_key_twice(shape):
    key = jax.random.key(9)
    a = normal_draws.normal(key, shape)
    assert a.shape == shape and a.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(normal_draws.normal(key, shape)))
    if a.size > 1:
        other = normal_draws.normal(jax.random.fold_in(key, 1), shape)
        assert not np.array_equal(np.asarray(a), np.asarray(other))
