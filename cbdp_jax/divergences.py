"""f-divergences, conjugates and variational objectives (public API)."""

from cbdp_jax._src.privacy.divergences import CONVENTIONS as CONVENTIONS
from cbdp_jax._src.privacy.divergences import DIVERGENCE_NAMES as DIVERGENCE_NAMES
from cbdp_jax._src.privacy.divergences import Divergence as Divergence
from cbdp_jax._src.privacy.divergences import alpha_conjugate as alpha_conjugate
from cbdp_jax._src.privacy.divergences import alpha_conjugate_constant as alpha_conjugate_constant
from cbdp_jax._src.privacy.divergences import alpha_exponent as alpha_exponent
from cbdp_jax._src.privacy.divergences import alpha_from_renyi as alpha_from_renyi
from cbdp_jax._src.privacy.divergences import alpha_optimal_scale as alpha_optimal_scale
from cbdp_jax._src.privacy.divergences import donsker_varadhan as donsker_varadhan
from cbdp_jax._src.privacy.divergences import get_divergence as get_divergence
from cbdp_jax._src.privacy.divergences import kl_optimal_shift as kl_optimal_shift
from cbdp_jax._src.privacy.divergences import log_mean_exp as log_mean_exp
from cbdp_jax._src.privacy.divergences import renyi_from_alpha as renyi_from_alpha
from cbdp_jax._src.privacy.divergences import renyi_scale_free as renyi_scale_free
from cbdp_jax._src.privacy.divergences import variational_objective as variational_objective

__all__ = [
    "CONVENTIONS",
    "DIVERGENCE_NAMES",
    "Divergence",
    "alpha_conjugate",
    "alpha_conjugate_constant",
    "alpha_exponent",
    "alpha_from_renyi",
    "alpha_optimal_scale",
    "donsker_varadhan",
    "get_divergence",
    "kl_optimal_shift",
    "log_mean_exp",
    "renyi_from_alpha",
    "renyi_scale_free",
    "variational_objective",
]
