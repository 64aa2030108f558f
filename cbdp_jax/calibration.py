"""Noise calibration against capacity-bounded adversaries, and a differentiable exact value (public API).

``calibrate`` answers "what is the least noise that keeps the (H, divergence) privacy loss below my
target?" for the Laplace, Gaussian and Poisson-subsampled Gaussian mechanisms, beside the unrestricted
requirement (docs/theory/calibration.md).
"""

from cbdp_jax._src.estimator.calibration import CALIBRATION_ADVERSARIES as CALIBRATION_ADVERSARIES
from cbdp_jax._src.estimator.calibration import CALIBRATION_DIVERGENCES as CALIBRATION_DIVERGENCES
from cbdp_jax._src.estimator.calibration import CALIBRATION_FAMILIES as CALIBRATION_FAMILIES
from cbdp_jax._src.estimator.calibration import Calibration as Calibration
from cbdp_jax._src.estimator.calibration import CalibrationResult as CalibrationResult
from cbdp_jax._src.estimator.calibration import calibrate as calibrate
from cbdp_jax._src.estimator.calibration import exact_value as exact_value
from cbdp_jax._src.estimator.calibration import value_and_slope as value_and_slope
from cbdp_jax._src.estimator.composed import composed_divergence as composed_divergence

__all__ = [
    "CALIBRATION_ADVERSARIES",
    "CALIBRATION_DIVERGENCES",
    "CALIBRATION_FAMILIES",
    "Calibration",
    "CalibrationResult",
    "calibrate",
    "composed_divergence",
    "exact_value",
    "value_and_slope",
]
