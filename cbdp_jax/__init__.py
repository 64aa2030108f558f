"""cbdp_jax: capacity bounded differential privacy in JAX.

How private is a randomized mechanism against an adversary whose attack comes from a known function class?
This package answers three ways, each checking the others: analytic closed forms and bounds
(:mod:`cbdp_jax.analytic`), exact restricted divergences by quadrature and a concave solver
(:mod:`cbdp_jax.exact`), and empirical estimates from trained Flax NNX adversaries
(:mod:`cbdp_jax.estimator`).
"""

__version__ = "0.1.0"

from cbdp_jax._src.validation import InvalidParameterError as InvalidParameterError

__all__ = ["InvalidParameterError", "__version__"]
