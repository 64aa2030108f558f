"""Values fixed by a structural argument, without a solve: degenerate, separable and Gaussian KL cases."""

from __future__ import annotations

import math

import numpy as np

from cbdp_jax._src.exact.inputs import _Adversary, _call_features
from cbdp_jax._src.exact.pairs import NoisePair
from cbdp_jax._src.infra.validation import InvalidParameterError, _fail


def _structural(
    pair: NoisePair, name: str, adv: _Adversary
) -> tuple[float, str, np.ndarray | None] | None:
    """Values fixed by a structural argument (no solve): (f_value, reason, theta or None), or None."""
    found = _structural_value(pair, name, adv)
    if found is not None or pair.family != "gaussian" or name != "kl" or adv.kind == "feature_map":
        return None if found is None else (*found, None)
    # Gaussian KL: log(p / q)(x) = (||v||^2 - 2 v.x) / (2 s^2) is affine, so h* = 1 + log(p / q), the
    # unrestricted optimum of the plain f-form, lies in every class containing the affine functions.
    v = np.asarray(pair.shift)
    _check_gaussian_kl_representable(float(np.linalg.norm(v)), float(pair.scale))
    s2 = pair.scale**2
    value = float(v @ v) / (2.0 * s2)
    theta = np.zeros(1 + (pair.dim if adv.kind == "linear" else adv.degree))
    theta[0] = 1.0 + value
    theta[1 : 1 + pair.dim] = -v / s2
    return (
        value,
        (
            "exact: log(p/q) is affine for a Gaussian pair, so h = 1 + log(p/q) lies in the class and "
            "attains the unrestricted KL ||v||^2 / (2 sigma^2) (docs/theory/exact_solver.md, section 4)"
        ),
        theta,
    )


def _check_gaussian_kl_representable(norm: float, sigma: float) -> None:
    """||v||^2 / (2 sigma^2), and h's slope ||v|| / sigma^2, must be finite in float64.

    The divergence is finite for every sigma > 0, but beyond float64's largest number (about 1.8e308)
    it would print as inf, which means an infinite divergence: refused instead, naming sigma and the
    smallest sigma whose value is representable.
    """
    big = math.log(np.finfo(np.float64).max)
    log_value = 2.0 * (math.log(norm) - math.log(sigma)) - math.log(2.0)
    log_slope = math.log(norm) - 2.0 * math.log(sigma)
    if max(log_value, log_slope) < big - 1.0:
        return
    smallest = max(
        norm / math.sqrt(2.0 * math.exp(big - 1.0)), math.sqrt(norm / math.exp(big - 1.0))
    )
    raise InvalidParameterError(
        f"sigma={sigma!r} is invalid: the Gaussian KL ||v||^2 / (2 sigma^2) is finite but about "
        f"1e{log_value / math.log(10.0):.0f}, beyond float64's range (about 1.8e308); use sigma >= "
        f"{smallest:.3g} for this shift"
    )


def _structural_value(pair: NoisePair, name: str, adv: _Adversary) -> tuple[float, str] | None:
    """Degenerate and separable cases: (f_value, reason), or None."""
    if name in ("tv", "hellinger", "js"):
        if adv.kind != "feature_map":
            return 0.0, (
                f"degenerate: f* of {name} is +inf above a finite level, so no non-constant "
                "polynomial h on R is admissible and the best constant gives 0 (docs/theory/mechanisms.md)"
            )
        if name == "tv":
            raise InvalidParameterError(
                "divergence='tv' is invalid with a feature-map adversary: its conjugate's domain "
                "|h| <= 1/2 makes the problem a linear program; use 'hellinger', 'js' or 'chi2'"
            )
        if pair.family == "point_mass":
            raise InvalidParameterError(
                f"divergence={name!r} is invalid for a point-mass pair with a feature-map adversary "
                "(the bounded-domain conjugate needs h bounded everywhere, which a feature map "
                "cannot be checked for); use 'kl', 'renyi', 'alpha' or 'chi2'"
            )
    if all(v == 0.0 for v in pair.shift):
        return 0.0, "P = Q (zero shift): every divergence is 0"
    if pair.family == "point_mass":
        if adv.kind == "feature_map":
            if pair.dim != 1:
                _fail("pair", pair.label, "a feature-map adversary needs a 1-D pair")
            f0 = _call_features(adv.fn, np.zeros(1))
            f1 = _call_features(adv.fn, np.asarray(pair.shift))
            if np.allclose(f0, f1, rtol=1e-12, atol=1e-12):  # equal up to rounding (sin(2 pi))
                return (
                    0.0,
                    "the feature map takes the same value at both points: no h separates them",
                )
        return math.inf, (
            "P and Q are distinct point masses: an h in H separates them and the objective is "
            "unbounded (paper Lemma 2; docs/theory/capacity_bounded_dp.md)"
        )
    return None
