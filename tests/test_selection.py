"""Order statistics by bisection on bit patterns: the same values as a sort, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax._src.statistics import selection


def _samples(rng, n, dtype):
    """Continuous values, heavy ties, signed zeros, infinities and huge / tiny magnitudes."""
    yield rng.standard_normal(n).astype(dtype)
    yield rng.integers(-3, 4, n).astype(dtype)  # many ties
    v = rng.standard_normal(n).astype(dtype)
    v[: n // 3] = -0.0
    v[n // 3 : n // 2] = 0.0
    yield v
    v = rng.standard_cauchy(n).astype(dtype)
    v[rng.integers(0, n, max(n // 10, 1))] = np.inf
    v[rng.integers(0, n, max(n // 10, 1))] = -np.inf
    yield v
    with np.errstate(over="ignore"):  # float16 overflows to +-inf: more test values, on purpose
        yield (np.exp(rng.uniform(-30, 30, n)) * rng.choice([-1, 1], n)).astype(dtype)


@pytest.mark.parametrize("n", [1, 2, 3, 16, 255, 256, 1001])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16])
def test_median_matches_jnp_median_bit_for_bit(n, dtype):
    rng = np.random.default_rng(n)
    ours, theirs = jax.jit(selection.median), jax.jit(jnp.median)
    for v in _samples(rng, n, dtype):
        a, b = np.asarray(ours(v)), np.asarray(theirs(v))
        # Same value; a zero's sign may differ (the sort, like the selection, counts -0.0 as +0.0).
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes() or (a == 0 and b == 0), (v, a, b)


def test_median_float64_and_vmapped():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        v = rng.standard_normal((8, 100))
        a = jax.jit(jax.vmap(selection.median))(v)
        assert a.dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(a), np.median(v, axis=1))
    v32 = rng.standard_normal((64, 256)).astype(np.float32)
    a = jax.jit(jax.vmap(selection.median))(v32)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(jnp.median(v32, axis=1)))


def test_median_nan_is_nan():
    v = np.array([1.0, np.nan, 3.0, 2.0], np.float32)
    assert np.isnan(selection.median(v))
    assert np.isnan(jnp.median(v))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_order_statistics_equal_the_sorted_values(dtype):
    rng = np.random.default_rng(1)
    v = rng.standard_normal(301).astype(dtype)
    v[::7] = v[0]  # ties
    ranks = np.array([0, 1, 17, 150, 299, 300])
    got = np.asarray(jax.jit(selection.order_statistics)(v, ranks))
    np.testing.assert_array_equal(got, np.sort(v)[ranks])
    # Negative control: one rank off gives a different value here (the check can fail).
    assert not np.array_equal(got, np.sort(v)[ranks - 1])


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="values: a non-empty 1-D"):
        selection.median(np.zeros((0,), np.float32))
    with pytest.raises(ValueError, match="values: a 1-D"):
        selection.order_statistics(np.zeros((2, 2), np.float32), [0])
    with pytest.raises(TypeError, match="values: a float"):
        selection.order_statistics(np.zeros(3, np.int32), [0])
