"""Empirical capacity-bounded privacy from trained adversaries (public API)."""

from cbdp_jax._src.estimator.adversary_fitting import TrainingProgress as TrainingProgress
from cbdp_jax._src.estimator.adversary_fitting import train_ensemble as train_ensemble
from cbdp_jax._src.estimator.budget import AUTO as AUTO
from cbdp_jax._src.estimator.budget import Budget as Budget
from cbdp_jax._src.estimator.budget import default_budget as default_budget
from cbdp_jax._src.estimator.budget import resolve_budget as resolve_budget
from cbdp_jax._src.estimator.estimate import estimate as estimate
from cbdp_jax._src.estimator.estimate import estimate_from_samples as estimate_from_samples
from cbdp_jax._src.estimator.types import EstimateResult as EstimateResult
from cbdp_jax._src.estimator.types import EstimatorConfig as EstimatorConfig

__all__ = [
    "AUTO",
    "Budget",
    "EstimateResult",
    "EstimatorConfig",
    "TrainingProgress",
    "default_budget",
    "estimate",
    "estimate_from_samples",
    "resolve_budget",
    "train_ensemble",
]
