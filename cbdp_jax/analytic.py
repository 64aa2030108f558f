"""Analytic closed forms and bounds for the Laplace and Gaussian mechanisms (public API)."""

from cbdp_jax._src.estimator.analytic import BOUND_FORMS as BOUND_FORMS
from cbdp_jax._src.estimator.analytic import MECHANISMS as MECHANISMS
from cbdp_jax._src.estimator.analytic import gaussian_kl as gaussian_kl
from cbdp_jax._src.estimator.analytic import gaussian_lin_kl as gaussian_lin_kl
from cbdp_jax._src.estimator.analytic import gaussian_renyi as gaussian_renyi
from cbdp_jax._src.estimator.analytic import laplace_kl as laplace_kl
from cbdp_jax._src.estimator.analytic import laplace_lin_kl as laplace_lin_kl
from cbdp_jax._src.estimator.analytic import laplace_renyi as laplace_renyi
from cbdp_jax._src.estimator.analytic_pinsker import (
    classical_pinsker_ipm_bound as classical_pinsker_ipm_bound,
)
from cbdp_jax._src.estimator.analytic_pinsker import (
    classical_pinsker_tv_bound as classical_pinsker_tv_bound,
)
from cbdp_jax._src.estimator.analytic_pinsker import (
    generalization_gap_bound as generalization_gap_bound,
)
from cbdp_jax._src.estimator.analytic_pinsker import pinsker_ipm_bound as pinsker_ipm_bound
from cbdp_jax._src.estimator.analytic_renyi_bounds import (
    gaussian_lin_renyi_upper_bound as gaussian_lin_renyi_upper_bound,
)
from cbdp_jax._src.estimator.analytic_renyi_bounds import (
    laplace_lin_renyi_upper_bound as laplace_lin_renyi_upper_bound,
)
from cbdp_jax._src.estimator.analytic_renyi_bounds import (
    laplace_renyi_lower_bound as laplace_renyi_lower_bound,
)
from cbdp_jax._src.estimator.analytic_renyi_bounds import (
    lin_renyi_crossing_alpha as lin_renyi_crossing_alpha,
)
from cbdp_jax._src.estimator.analytic_renyi_bounds import (
    matrix_mechanism_lin_renyi_upper_bound as matrix_mechanism_lin_renyi_upper_bound,
)
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import gaussian_chi2 as gaussian_chi2
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import (
    gaussian_hellinger as gaussian_hellinger,
)
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import gaussian_tv as gaussian_tv
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import laplace_chi2 as laplace_chi2
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import (
    laplace_hellinger as laplace_hellinger,
)
from cbdp_jax._src.estimator.analytic_tv_chi2_hellinger import laplace_tv as laplace_tv

__all__ = [
    "BOUND_FORMS",
    "MECHANISMS",
    "classical_pinsker_ipm_bound",
    "classical_pinsker_tv_bound",
    "gaussian_chi2",
    "gaussian_hellinger",
    "gaussian_kl",
    "gaussian_lin_kl",
    "gaussian_lin_renyi_upper_bound",
    "gaussian_renyi",
    "gaussian_tv",
    "generalization_gap_bound",
    "laplace_chi2",
    "laplace_hellinger",
    "laplace_kl",
    "laplace_lin_kl",
    "laplace_lin_renyi_upper_bound",
    "laplace_renyi",
    "laplace_renyi_lower_bound",
    "laplace_tv",
    "lin_renyi_crossing_alpha",
    "matrix_mechanism_lin_renyi_upper_bound",
    "pinsker_ipm_bound",
]
