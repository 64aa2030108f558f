"""Shared test configuration.

float64 is enabled for the whole test session: the exact and analytic layers are checked to 1e-6 relative
and need it. Estimator tests pass an explicit dtype where float32 behaviour is what they check.
"""

import jax

jax.config.update("jax_enable_x64", True)
