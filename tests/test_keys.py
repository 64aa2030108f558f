"""The host-side permutation of ``cbdp_jax._src.infra.keys`` gives JAX's own indices.

The estimator's train / validation / test split uses it in place of ``jax.random.permutation`` (which
sorts on the device, about 1.6 s for 2.25 million indices on a CPU), so every split, and with it every
result, must be the one JAX's permutation gives for the same key.
"""

import jax
import numpy as np
import pytest

from cbdp_jax._src.infra import keys


# 1 round of sorting up to n = 1625, 2 rounds up to about 2.6 million, 3 beyond
@pytest.mark.parametrize("n", [1, 2, 3, 1000, 1625, 1626, 65_537, 100_003])
@pytest.mark.parametrize("seed", [0, 7])
def test_host_permutation_equals_jax_permutation(n, seed):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(
        keys.permutation(key, n), np.asarray(jax.random.permutation(key, n))
    )


@pytest.mark.slow
def test_host_permutation_equals_jax_permutation_at_three_rounds():
    key = jax.random.key(3)
    n = 2_700_000
    np.testing.assert_array_equal(
        keys.permutation(key, n), np.asarray(jax.random.permutation(key, n))
    )


def test_the_radix_argsort_is_stable_where_keys_tie():
    # Negative control of the stability the permutation needs: many ties in the high and low halves.
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 4, 10_000, dtype=np.uint32) * np.uint32(65536) + rng.integers(
        0, 3, 10_000, dtype=np.uint32
    )
    np.testing.assert_array_equal(keys._stable_argsort_u32(bits), np.argsort(bits, kind="stable"))
    assert not np.array_equal(np.argsort(bits, kind="quicksort"), np.argsort(bits, kind="stable"))
