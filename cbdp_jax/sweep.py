"""Sweeps of many adversaries in one compiled program, sharded over devices (public API)."""

from cbdp_jax._src.estimator.sweep import estimate_sweep as estimate_sweep
from cbdp_jax._src.estimator.sweep import evaluate_sweep as evaluate_sweep
from cbdp_jax._src.estimator.sweep import select_best as select_best
from cbdp_jax._src.estimator.sweep import train_sweep as train_sweep
from cbdp_jax._src.estimator.sweep_types import Member as Member
from cbdp_jax._src.estimator.sweep_types import SweepConfig as SweepConfig
from cbdp_jax._src.estimator.sweep_types import SweepTraining as SweepTraining

__all__ = [
    "Member",
    "SweepConfig",
    "SweepTraining",
    "estimate_sweep",
    "evaluate_sweep",
    "select_best",
    "train_sweep",
]
