"""cbdp_jax: capacity bounded differential privacy in JAX.

How private is a randomized mechanism against an adversary whose attack comes from a known function class?
This package answers three ways, each checking the others: analytic closed forms and bounds
(:mod:`cbdp_jax.analytic`), exact restricted divergences by quadrature and a concave solver
(:mod:`cbdp_jax.exact`), and empirical estimates from trained Flax NNX adversaries
(:mod:`cbdp_jax.estimator`), every bound from :mod:`cbdp_jax.statistics`.

Compiled programs are cached on disk (JAX's persistent compilation cache) in
``$CBDP_JAX_CACHE_DIR`` or ``~/.cache/cbdp_jax/jax``, so a second process does not recompile them. Set
``CBDP_JAX_COMPILATION_CACHE=0`` to leave JAX's cache settings alone; a cache folder you configured
yourself (``jax_compilation_cache_dir``) is always respected. The ``cbdp`` command line also keeps the
estimator's executables in ``programs/`` there, so that its next process skips tracing as well
(``CBDP_JAX_PROGRAM_CACHE=0`` turns that off).
"""

from cbdp_jax._src.infra.cache import enable_compilation_cache as _enable_compilation_cache
from cbdp_jax._src.infra.validation import InvalidParameterError as InvalidParameterError
from cbdp_jax._src.infra.version import __version__ as __version__

_enable_compilation_cache()

__all__ = ["InvalidParameterError", "__version__"]
