"""Shared test configuration.

float64 is enabled for the whole test session: the exact and analytic layers are checked to 1e-6 relative
and need it. Estimator tests pass an explicit dtype where float32 behaviour is what they check.

Hypothesis runs derandomized (a fixed sequence of examples, the same on every run and machine): a
property test that fails once fails every time, and CI cannot be red by the luck of a draw. Set
``HYPOTHESIS_PROFILE=explore`` to draw fresh examples locally.
"""

import os

import chex
import jax
import pytest
from hypothesis import settings

jax.config.update("jax_enable_x64", True)

settings.register_profile("derandomized", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))


@pytest.fixture
def max_traces(monkeypatch):
    """``max_traces(module, name, n)``: the body ``module.name`` of a compiled program may be traced at
    most ``n`` more times in this test (``chex.assert_max_traces``; the programs look their bodies up
    when traced, so the wrapper sees every trace and nothing else)."""

    def wrap(module, name: str, n: int) -> None:
        chex.clear_trace_counter()
        monkeypatch.setattr(module, name, chex.assert_max_traces(getattr(module, name), n=n))

    return wrap
