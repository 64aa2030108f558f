"""Empirical capacity-bounded privacy from trained adversaries (public API)."""

from cbdp_jax._src.estimator import EstimateResult as EstimateResult
from cbdp_jax._src.estimator import EstimatorConfig as EstimatorConfig
from cbdp_jax._src.estimator import estimate as estimate
from cbdp_jax._src.estimator import estimate_from_samples as estimate_from_samples
from cbdp_jax._src.training import train_ensemble as train_ensemble

__all__ = [
    "EstimateResult",
    "EstimatorConfig",
    "estimate",
    "estimate_from_samples",
    "train_ensemble",
]
