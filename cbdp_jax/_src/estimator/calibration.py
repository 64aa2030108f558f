"""Noise calibration against a capacity-bounded adversary, and a differentiable exact value (private).

The question a user has is not "how private is this noise?" but "what is the least noise that keeps the
(H, divergence) privacy below my target?". For a class H linear in its parameters the exact value
V(s) = D^H(P_s, Q_s) is monotone in the noise parameter s (decreasing in sigma, increasing in the Laplace
epsilon: more noise is a garbling of less noise, and restricted divergences cannot grow under it for the
classes here -- checked numerically in tests/test_calibration.py), so the calibrated noise is the root
of V(s) = target, found by bracketing and a safeguarded Newton iteration in log s. Newton needs V'(s),
which the envelope theorem gives without differentiating the optimiser: V'(s) = d J(theta*; s) / ds at
the optimal theta* held fixed (:mod:`cbdp_jax._src.estimator.composed`). The same derivative backs
:func:`exact_value`, a ``jax.custom_vjp`` function usable inside ``jax.grad``.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019 (Definition
  3, Theorem 4); docs/theory/calibration.md (the root search, the envelope-theorem derivative and what
  the T-step values cover).

"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src import exact as ex
from cbdp_jax._src.estimator import composed
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_choice,
    check_finite_scalar,
    check_in_range,
    check_int_at_least,
    check_positive,
)

CALIBRATION_FAMILIES = ("laplace", "gaussian", "subsampled_gaussian")
CALIBRATION_ADVERSARIES = ("linear", "poly", "unrestricted")
CALIBRATION_DIVERGENCES = ("kl", "renyi")

_RTOL = 1e-10  # the root search stops when |V / target - 1| <= this
_MAX_ITER = 80
_MAX_BRACKET = 60  # doublings / halvings of the noise while bracketing
_MAX_SHIFT = 200.0  # bracketing stays within shift / noise scale in [1 / 200, 200]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """What is calibrated: the mechanism family, the adversary class, the divergence and the release.

    Attributes:
      family: ``'laplace'`` (calibrates epsilon), ``'gaussian'`` or ``'subsampled_gaussian'``
        (calibrate sigma).
      adversary: ``'linear'``, ``'poly'``, ``'unrestricted'``, or a feature map (a callable
        ``x [n] -> [n, m]``; the class is {b + w . phi(x)}, 1-D).
      divergence: ``'kl'`` or ``'renyi'``.
      alpha: The Renyi order (> 1) for ``'renyi'``, else None.
      degree: The polynomial degree for ``'poly'`` (1 otherwise).
      sensitivity: The shift v of the neighbouring output (the clipping norm for DP-SGD), > 0.
      sampling_rate: The subsampled Gaussian's q in (0, 1] (None for the other families).
      steps: T >= 1, the number of non-adaptive releases composed (docs/theory/calibration.md).
      direction: The subsampled Gaussian's neighbouring direction, ``'remove'`` or ``'add'``.

    """

    family: str
    adversary: Any
    divergence: str
    alpha: float | None = None
    degree: int = 1
    sensitivity: float = 1.0
    sampling_rate: float | None = None
    steps: int = 1
    direction: str = "remove"

    def __post_init__(self) -> None:
        check_choice("family", self.family, CALIBRATION_FAMILIES)
        if not callable(self.adversary):
            check_choice(
                "adversary",
                self.adversary,
                CALIBRATION_ADVERSARIES + ("<a callable feature map x [n] -> [n, m]>",),
            )
        check_choice("divergence", self.divergence, CALIBRATION_DIVERGENCES)
        check_choice("direction", self.direction, ex.DIRECTIONS)
        if self.divergence == "renyi":
            from cbdp_jax._src.infra.validation import check_alpha

            object.__setattr__(self, "alpha", check_alpha(self.alpha))
        elif self.alpha is not None:
            _fail("alpha", self.alpha, "must be None for divergence 'kl'", "only 'renyi' uses it")
        degree = check_int_at_least("degree", self.degree, 1)
        if self.adversary != "poly" and degree != 1:
            _fail("degree", self.degree, f"must be 1 for adversary {self.label!r}")
        object.__setattr__(self, "degree", degree)
        object.__setattr__(self, "sensitivity", check_positive("sensitivity", self.sensitivity))
        object.__setattr__(self, "steps", check_int_at_least("steps", self.steps, 1))
        if self.family == "subsampled_gaussian":
            if self.sampling_rate is None:
                _fail("sampling_rate", None, "must be given for family 'subsampled_gaussian'")
            rate = check_in_range("sampling_rate", self.sampling_rate, 0.0, 1.0, low_open=True)
            object.__setattr__(self, "sampling_rate", rate)
        elif self.sampling_rate is not None:
            _fail(
                "sampling_rate",
                self.sampling_rate,
                f"must be None for family {self.family!r}",
                "only 'subsampled_gaussian' samples",
            )

    @property
    def label(self) -> str:
        """The class's name: ``'linear'``, ``'poly_k'``, ``'unrestricted'`` or ``'feature_map'``."""
        if callable(self.adversary):
            return "feature_map"
        return self.adversary if self.adversary != "poly" else f"poly_{self.degree}"

    @property
    def parameter(self) -> str:
        """``'epsilon'`` for Laplace, else ``'sigma'``."""
        return "epsilon" if self.family == "laplace" else "sigma"

    def pair(self, noise: float):
        """The one-step pair (a NeighbouringPair) at the noise parameter (epsilon or sigma)."""
        if self.family == "laplace":
            return ex.laplace_pair(noise, self.sensitivity)
        if self.family == "gaussian":
            return ex.gaussian_pair(noise, self.sensitivity)
        return ex.subsampled_gaussian_pair(
            noise, self.sampling_rate, self.sensitivity, self.direction
        )

    def unrestricted(self) -> Calibration:
        """The same question against an unrestricted adversary."""
        return dataclasses.replace(self, adversary="unrestricted", degree=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """The calibrated noise, the unrestricted requirement beside it, and how much noise is saved.

    Attributes:
      calibration: The question asked.
      target: The target value of the (H, divergence) privacy loss.
      noise: The calibrated epsilon (Laplace: the largest that meets the target) or sigma (the
        smallest that does).
      value: The exact restricted value at ``noise`` (equals ``target`` to ~1e-10 relative).
      unrestricted_noise: The same requirement against an unrestricted adversary.
      unrestricted_value: The unrestricted value at ``unrestricted_noise``.
      noise_ratio: The restricted noise scale over the unrestricted one (sigma / sigma_unrestricted,
        or epsilon_unrestricted / epsilon for Laplace, whose noise scale is 1 / epsilon): <= 1.
      noise_saved: ``1 - noise_ratio``.
      slope: dV / d(noise) at ``noise`` (envelope theorem).
      iterations: Exact solves the root search used (both searches together).
      converged: Whether both searches met their tolerance.

    """

    calibration: Calibration
    target: float
    noise: float
    value: float
    unrestricted_noise: float
    unrestricted_value: float
    noise_ratio: float
    noise_saved: float
    slope: float
    iterations: int
    converged: bool

    def to_dict(self) -> dict[str, Any]:
        """A flat record for JSON (``epsilon`` or ``sigma`` named after the family's parameter)."""
        c = self.calibration
        name = c.parameter
        return {
            "mechanism": c.family,
            "adversary": c.label,
            "divergence": c.divergence,
            "alpha": c.alpha,
            "sensitivity": c.sensitivity,
            "sampling_rate": c.sampling_rate,
            "steps": c.steps,
            "direction": c.direction if c.family == "subsampled_gaussian" else None,
            "target": self.target,
            name: self.noise,
            "value": self.value,
            f"unrestricted_{name}": self.unrestricted_noise,
            "unrestricted_value": self.unrestricted_value,
            "noise_ratio": self.noise_ratio,
            "noise_saved": self.noise_saved,
            "slope": self.slope,
            "iterations": self.iterations,
            "converged": self.converged,
        }


@functools.lru_cache(maxsize=256)
def _evaluate(cal: Calibration, noise: float) -> tuple[float, float]:
    """(V(noise), V'(noise)), cached: Newton, the bracket and custom_vjp revisit the same points."""
    with jax.enable_x64(True):
        res, slope = composed.value_and_slope(
            cal.pair(noise), cal.divergence, cal.steps, cal.adversary, cal.degree, cal.alpha
        )
        return float(res.value), float(slope())


def value_and_slope(cal: Calibration, noise: float) -> tuple[float, float]:
    """The exact value at ``noise`` and its derivative in the noise (envelope theorem).

    Args:
      cal: The question.
      noise: epsilon (Laplace) or sigma, > 0.

    Returns:
      ``(value, d value / d noise)``.

    Raises:
      InvalidParameterError: For a bad noise, or a case the exact layer refuses.

    """
    return _evaluate(cal, check_positive(cal.parameter, noise))


def _initial_noise(cal: Calibration, target: float) -> float:
    """The unrestricted Gaussian requirement (a closed form), a scale to start bracketing from."""
    order = 1.0 if cal.divergence == "kl" else cal.alpha
    q = cal.sampling_rate if cal.family == "subsampled_gaussian" else 1.0
    sigma = cal.sensitivity * q * math.sqrt(cal.steps * order / (2.0 * target))
    if cal.family == "laplace":
        return 1.0 / max(sigma, 1e-12)
    return max(sigma, 1e-6 * cal.sensitivity)


def _root(cal: Calibration, target: float, start: float) -> tuple[float, float, float, int, bool]:
    """Solves V(s) = target in t = log s: bracket, then Newton safeguarded by bisection.

    Returns (s, V(s), V'(s), evaluations, converged).
    """
    sign = 1.0 if cal.family == "laplace" else -1.0  # V increases with eps, decreases with sigma
    evals = 0

    def g(t: float) -> tuple[float, float, float, float]:
        nonlocal evals
        evals += 1
        s = math.exp(t)
        v, dv = _evaluate(cal, s)
        if not (v > 0 and math.isfinite(v)):
            return (math.inf if v > 0 else -math.inf), 0.0, v, dv
        return math.log(v / target), s * dv / v, v, dv

    t = math.log(start)
    lo = hi = None  # g(lo) < 0 < g(hi)
    step = math.log(2.0)
    for _ in range(_MAX_BRACKET):
        # The exact layer is built for shifts up to ~_MAX_SHIFT noise scales; beyond, stop looking.
        shift = cal.sensitivity * (math.exp(t) if cal.family == "laplace" else math.exp(-t))
        if not (1.0 / _MAX_SHIFT <= shift <= _MAX_SHIFT):
            break
        gt = g(t)
        if gt[0] < 0:
            lo = (t, gt)
            t += sign * step
        else:
            hi = (t, gt)
            t -= sign * step
        if lo is not None and hi is not None:
            break
    if lo is None or hi is None:
        side = "below" if hi is None else "above"
        raise InvalidParameterError(
            f"target={target!r} is invalid for this question: the exact value stays {side} it for "
            f"every {cal.parameter} with shift / noise scale in [{1 / _MAX_SHIFT:g}, {_MAX_SHIFT:g}] "
            "(e.g. the subsampled Gaussian's 'add' direction tends to a finite limit as sigma -> 0; "
            "docs/theory/calibration.md)"
        )
    best = lo if abs(lo[1][0]) < abs(hi[1][0]) else hi
    for _ in range(_MAX_ITER):
        t_b, (g_b, dg_b, v_b, dv_b) = best
        if abs(v_b / target - 1.0) <= _RTOL:
            return math.exp(t_b), v_b, dv_b, evals, True
        a, b = sorted((lo[0], hi[0]))
        if b - a < 1e-15 * max(1.0, abs(a)):
            break
        t_new = t_b - g_b / dg_b if dg_b != 0 and math.isfinite(dg_b) else 0.5 * (a + b)
        if not (a < t_new < b):
            t_new = 0.5 * (a + b)
        gn = g(t_new)
        if gn[0] < 0:
            lo = (t_new, gn)
        else:
            hi = (t_new, gn)
        best = (t_new, gn)
    t_b, (_, _, v_b, dv_b) = best
    return math.exp(t_b), v_b, dv_b, evals, abs(v_b / target - 1.0) <= 1e-8


def calibrate(
    family: str,
    target: float,
    adversary: str = "linear",
    divergence: str = "renyi",
    *,
    alpha: float | None = None,
    degree: int = 1,
    sensitivity: float = 1.0,
    sampling_rate: float | None = None,
    steps: int = 1,
    direction: str = "remove",
) -> CalibrationResult:
    """The least noise whose exact (H, divergence) privacy loss meets ``target``.

    Gaussian / subsampled Gaussian: the smallest sigma with D^H(P_sigma, Q_sigma) <= target; Laplace:
    the largest epsilon with D^H <= target. The same question against an unrestricted adversary is
    answered beside it, and the noise saved is their ratio. With ``steps`` = T the release is T
    non-adaptive steps (each with fresh noise, same data), valued exactly where a rule covers it
    (docs/theory/calibration.md, section 3; otherwise refused).

    Args:
      family: ``'laplace'``, ``'gaussian'`` or ``'subsampled_gaussian'``.
      target: The target privacy loss, > 0 (on the reported scale: Renyi for ``'renyi'``).
      adversary: ``'linear'``, ``'poly'``, ``'unrestricted'`` or a feature map ``x [n] -> [n, m]``.
      divergence: ``'kl'`` or ``'renyi'``.
      alpha: The Renyi order, > 1, for ``'renyi'``.
      degree: The polynomial degree for ``'poly'``.
      sensitivity: The shift v (the clipping norm in DP-SGD), > 0.
      sampling_rate: The subsampled Gaussian's q in (0, 1].
      steps: T >= 1.
      direction: The subsampled Gaussian's ``'remove'`` (P is the mixture) or ``'add'``.

    Returns:
      A :class:`CalibrationResult`.

    Raises:
      InvalidParameterError: For bad inputs, a target the value never crosses, or a case the exact
        layer refuses.

    Examples:
      >>> r = calibrate("gaussian", 0.5, "linear", "kl")
      >>> round(r.noise, 6), round(r.unrestricted_noise, 6)  # the optimal h is linear: no saving
      (1.0, 1.0)

    References:
      Paper Definition 3 and Theorem 4; docs/theory/calibration.md.

    """
    # The target first: it is the question asked, so its error comes before the options' (a negative
    # target is reported as such even when the divergence's order is missing too).
    target = check_positive("target", check_finite_scalar("target", target))
    cal = Calibration(
        family=family,
        adversary=adversary,
        divergence=divergence,
        alpha=alpha,
        degree=degree,
        sensitivity=sensitivity,
        sampling_rate=sampling_rate,
        steps=steps,
        direction=direction,
    )
    free = cal.unrestricted()
    s_free, v_free, _, n_free, ok_free = _root(free, target, _initial_noise(cal, target))
    if cal.adversary == "unrestricted":
        s, v, dv, n, ok = s_free, v_free, _evaluate(free, s_free)[1], 0, ok_free
    else:
        s, v, dv, n, ok = _root(cal, target, s_free)
    ratio = s_free / s if cal.family == "laplace" else s / s_free
    return CalibrationResult(
        calibration=cal,
        target=target,
        noise=s,
        value=v,
        unrestricted_noise=s_free,
        unrestricted_value=v_free,
        noise_ratio=ratio,
        noise_saved=1.0 - ratio,
        slope=dv,
        iterations=n + n_free,
        converged=bool(ok and ok_free),
    )


# --------------------------------------------------------------------------------------------------
# A differentiable exact value
# --------------------------------------------------------------------------------------------------


def _callback_value(cal: Calibration, noise: Any) -> np.ndarray:
    return np.asarray(_evaluate(cal, float(noise))[0], dtype=np.asarray(noise).dtype)


def _callback_slope(cal: Calibration, noise: Any) -> np.ndarray:
    return np.asarray(_evaluate(cal, float(noise))[1], dtype=np.asarray(noise).dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _exact_value(noise: jax.Array, cal: Calibration) -> jax.Array:
    shape = jax.ShapeDtypeStruct((), noise.dtype)
    return jax.pure_callback(
        functools.partial(_callback_value, cal), shape, noise, vmap_method="sequential"
    )


def _exact_value_fwd(noise: jax.Array, cal: Calibration) -> tuple[jax.Array, jax.Array]:
    return _exact_value(noise, cal), noise


def _exact_value_bwd(cal: Calibration, noise: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    shape = jax.ShapeDtypeStruct((), noise.dtype)
    slope = jax.pure_callback(
        functools.partial(_callback_slope, cal), shape, noise, vmap_method="sequential"
    )
    return (g * slope,)


_exact_value.defvjp(_exact_value_fwd, _exact_value_bwd)


def exact_value(noise: Any, cal: Calibration) -> jax.Array:
    """The exact value at the noise parameter as a JAX function, differentiable in the noise.

    The forward pass runs the exact solver (outside the trace, through ``jax.pure_callback``); the
    backward pass returns d value / d noise from the envelope theorem -- the partial derivative of the
    concave objective at the optimum held fixed -- so ``jax.grad`` never differentiates the solver's
    iterations (a ``jax.custom_vjp``). Works under ``jax.jit`` and ``jax.vmap`` (sequentially).

    Args:
      noise: epsilon (Laplace) or sigma, a scalar > 0 (float64 when ``jax_enable_x64`` is on).
      cal: The question (:class:`Calibration`).

    Returns:
      The value, a scalar array of the noise's dtype.

    Examples:
      >>> import jax
      >>> cal = Calibration(family="gaussian", adversary="linear", divergence="kl")
      >>> float(jax.grad(exact_value)(2.0, cal))  # d/dsigma 1 / (2 sigma^2) = -1 / sigma^3
      -0.125

    References:
      docs/theory/calibration.md, section 2.

    """
    noise = jnp.asarray(noise, dtype=jnp.result_type(float))
    return _exact_value(noise, cal)
