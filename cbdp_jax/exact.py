"""Exact restricted and unrestricted divergences for Laplace, Gaussian and point-mass pairs (public API).

Deterministic float64 quadrature plus a concave (Newton) solver for classes linear in their parameters:
linear, polynomial and user feature maps (docs/theory/objectives.md and mechanisms.md). Polynomial classes are solved in an
orthonormal basis and certified (Newton decrement, monotonicity in the degree) up to a documented degree
limit per noise family and divergence (docs/theory/exact_solver.md).
"""

from cbdp_jax._src.exact import ADVERSARIES as ADVERSARIES
from cbdp_jax._src.exact import DEGREE_LIMITS as DEGREE_LIMITS
from cbdp_jax._src.exact import DIRECTIONS as DIRECTIONS
from cbdp_jax._src.exact import FAMILIES as FAMILIES
from cbdp_jax._src.exact import GAP_TOL as GAP_TOL
from cbdp_jax._src.exact import ExactResult as ExactResult
from cbdp_jax._src.exact import NoisePair as NoisePair
from cbdp_jax._src.exact import degree_limit as degree_limit
from cbdp_jax._src.exact import gaussian_pair as gaussian_pair
from cbdp_jax._src.exact import laplace_pair as laplace_pair
from cbdp_jax._src.exact import noise_pair_from as noise_pair_from
from cbdp_jax._src.exact import output_laws as output_laws
from cbdp_jax._src.exact import point_mass_pair as point_mass_pair
from cbdp_jax._src.exact import restricted_divergence as restricted_divergence
from cbdp_jax._src.exact import restricted_divergence_curve as restricted_divergence_curve
from cbdp_jax._src.exact import restricted_divergence_degrees as restricted_divergence_degrees
from cbdp_jax._src.exact import subsampled_gaussian_pair as subsampled_gaussian_pair
from cbdp_jax._src.exact import unrestricted_divergence as unrestricted_divergence

__all__ = [
    "ADVERSARIES",
    "DEGREE_LIMITS",
    "DIRECTIONS",
    "FAMILIES",
    "GAP_TOL",
    "ExactResult",
    "NoisePair",
    "degree_limit",
    "gaussian_pair",
    "laplace_pair",
    "noise_pair_from",
    "output_laws",
    "point_mass_pair",
    "restricted_divergence",
    "restricted_divergence_curve",
    "restricted_divergence_degrees",
    "subsampled_gaussian_pair",
    "unrestricted_divergence",
]
