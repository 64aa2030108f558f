"""The suite's precision switch (tests/conftest.py): x64 off unless a test carries the ``x64`` marker."""

import jax
import jax.numpy as jnp
import pytest


def test_unmarked_tests_run_with_jax_default_32_bit():
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float32


@pytest.mark.x64
def test_marked_tests_get_64_bit_jax():
    assert jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float64


def test_x64_does_not_leak_out_of_a_marked_test():
    # runs after the marked test above (file order): the fixture's context manager restored the flag
    assert not jax.config.jax_enable_x64
