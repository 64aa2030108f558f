"""Exact values of T-step non-adaptive releases, and their derivative in the noise scale (private).

A non-adaptive T-step release outputs (x_1, ..., x_T), each x_t an independent draw of the same one-step
mechanism run on the same data (e.g. a fixed canary gradient summed with fresh noise at every step of
DP-SGD). P^T and Q^T are then product laws, and three cases are exact (docs/theory/calibration.md,
section 3):

* unrestricted KL and Renyi add up over steps (the divergences of product laws add);
* KL restricted to an *additive* class H^T = {sum_t h_t(x_t) : h_t in H}, H translation invariant and
  containing the constants (linear and poly_k are): the Donsker-Varadhan objective separates over
  independent blocks, so KL^{H^T}(P^T, Q^T) = T KL^H(P, Q) (paper Theorem 4 with equality);
* the linear class on R^T, for the Gaussian and subsampled Gaussian: both objectives are convex and
  invariant under permuting the steps, so an optimal h = b + a . x has equal coefficients and depends on
  x only through the sum S = sum_t x_t. The T-step value is the 1-D value for the law of S: N(T v, T s^2)
  against N(0, T s^2) (Gaussian), sum_k Binom(T, q)(k) N(k v, T s^2) against N(0, T s^2) (subsampled).

Everything else (restricted Renyi of additive polynomial classes, Laplace beyond KL) has no exact
reduction here: paper Theorem 4 only bounds it by the sum, and the call is refused. Adaptive
composition is not covered at all (an open problem of the paper).

The derivative of a value in the noise parameter s (epsilon or sigma) is taken by the envelope theorem:
V(s) = sup_theta J(theta; s), so V'(s) = dJ/ds at the optimal theta held fixed, which for an objective
E_P[h] - E_Q[f*(h)] is E_P[h d_s log p] - E_Q[f*(h) d_s log q] (score functions; the optimum need not be
differentiated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cbdp_jax._src.exact.certificate import _conjugate
from cbdp_jax._src.exact.degrees import _solve_1d
from cbdp_jax._src.exact.float64 import _exp
from cbdp_jax._src.exact.inputs import _parse_adversary, _parse_divergence
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.exact.limits import _check_degree
from cbdp_jax._src.exact.pairs import NoisePair, output_laws
from cbdp_jax._src.exact.restricted import _refuse_uncertified, _restricted_many
from cbdp_jax._src.exact.result import ExactResult, _from_solution
from cbdp_jax._src.exact.structural import _structural
from cbdp_jax._src.exact.unrestricted import _unrestricted_rule, unrestricted_divergence
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_alpha,
    check_int_at_least,
)
from cbdp_jax._src.privacy.divergences import get_divergence

_BINOM_CUT = 1e-18  # binomial weights below this fraction of the largest are dropped (mass < 1e-14)


def _sum_law(pair: NoisePair, steps: int) -> tuple[_Law1D, float]:
    """The law of S = sum_t x_t in units of its noise (standardised), and that unit (sqrt(T) s)."""
    v = pair.shift[0]
    unit = math.sqrt(steps) * pair.scale
    if pair.family == "gaussian":
        return _Law1D("gaussian", steps * v / unit), unit
    q = pair.sampling_rate
    k = np.arange(steps + 1)
    if q == 1.0:
        logw = np.where(k == steps, 0.0, -np.inf)
    else:
        logw = (
            np.array(
                [
                    math.lgamma(steps + 1) - math.lgamma(j + 1) - math.lgamma(steps - j + 1)
                    for j in k
                ]
            )
            + k * math.log(q)
            + (steps - k) * math.log1p(-q)
        )
    keep = logw > np.max(logw) + math.log(_BINOM_CUT)
    w = np.exp(logw[keep] - np.max(logw[keep]))
    w /= w.sum()
    centres = k[keep] * v / unit
    delta = float(centres[np.argmax(np.abs(centres))])
    law = _Law1D(
        "mixture",
        delta,
        tuple(float(x) for x in w),
        tuple(float(c) for c in centres),
        pair.direction == "remove",
    )
    return law, unit


def _check_steps_case(pair: NoisePair, name: str, adversary: str, steps: int) -> str:
    """Which exact rule covers the case: 'single', 'sum', 'additive' or 'unrestricted'; else refuse."""
    if steps == 1:
        return "single"
    if pair.dim != 1:
        _fail("pair", pair.label, "must be 1-dimensional for a T-step value (steps > 1)")
    if isinstance(adversary, str) and adversary == "unrestricted":
        if name not in ("kl", "renyi"):
            _fail("divergence", name, "must be 'kl' or 'renyi' for an unrestricted T-step value")
        return "unrestricted"
    if isinstance(adversary, str) and adversary == "linear" and pair.family != "laplace":
        return "sum"
    if name == "kl":
        return "additive"
    raise InvalidParameterError(
        f"steps={steps} is invalid for adversary={adversary!r} with divergence={name!r} on a "
        f"{pair.family} pair: the T-step value is exact only for KL with an additive class, for the "
        "linear class of the Gaussian and subsampled Gaussian, and unrestricted (KL, Renyi); "
        "restricted Renyi of an additive class is only bounded by the sum (paper Theorem 4) -- "
        "see docs/theory/calibration.md, section 3"
    )


def composed_divergence(
    pair: NoisePair | Any,
    divergence: str,
    steps: int = 1,
    adversary: str = "linear",
    *,
    degree: int = 1,
    alpha: float | None = None,
) -> ExactResult:
    """The exact value of the T-step non-adaptive release (x_1, ..., x_T) of a one-step pair.

    Args:
      pair: The one-step pair (a :class:`~cbdp_jax.mechanisms.NeighbouringPair`, e.g.
        ``exact.laplace_pair(1.0)``, or a mechanism), 1-D for T > 1.
      divergence: ``'kl'`` or ``'renyi'``.
      steps: T, an integer >= 1.
      adversary: ``'linear'``, ``'poly'`` (for T > 1 the additive class sum_t p_t(x_t)),
        ``'unrestricted'``, or a 1-D feature map ``x [n] -> [n, m]`` (for T > 1: KL only, additive).
      degree: The polynomial degree for ``'poly'``.
      alpha: The Renyi order (> 1) for ``'renyi'``.

    Returns:
      An :class:`~cbdp_jax.exact.ExactResult` for the T-step release; its ``reason`` names the rule
      used (for the linear class reduced to the sum S, ``theta`` = (b, a) for h = b + a S).

    Raises:
      InvalidParameterError: For bad inputs, a combination no exact rule covers (module docstring),
        or a value that cannot be certified.

    References:
      Paper Theorem 4 (sequential non-adaptive composition); docs/theory/calibration.md, section 3.

    """
    with jax.enable_x64(True):
        return value_and_slope(pair, divergence, steps, adversary, degree, alpha)[0]


def value_and_slope(
    pair: NoisePair | Any,
    divergence: str,
    steps: int,
    adversary: str,
    degree: int,
    alpha: float | None,
) -> tuple[ExactResult, Callable[[], float]]:
    """The T-step value and a function giving dV/ds, s the pair's noise parameter (eps or sigma).

    The slope is the envelope theorem's partial derivative at the optimum (module docstring). Needs
    float64 (callers run it under ``jax.enable_x64``).
    """
    pair = output_laws(pair)
    steps = check_int_at_least("steps", steps, 1)
    name, _ = _parse_divergence(divergence, None, "abs")
    if name not in ("kl", "renyi"):
        _fail("divergence", divergence, "must be 'kl' or 'renyi' here")
    a = check_alpha(alpha) if name == "renyi" else None
    if name == "kl" and alpha is not None:
        _fail("alpha", alpha, "must be None for divergence 'kl'", "only 'renyi' uses it")
    case = _check_steps_case(pair, name, adversary, steps)
    noise = 1.0 / pair.scale if pair.family == "laplace" else pair.scale
    if isinstance(adversary, str) and adversary == "unrestricted":
        return _unrestricted(pair, name, a, steps, noise)
    if case == "sum":
        law, unit = _sum_law(pair, steps)
        res, sol = _solve(pair, law, unit, name, "linear", 1, a)
        if sol is None:  # Gaussian KL: log(p/q) is affine in the T steps, T ||v||^2 / (2 sigma^2)
            v2 = float(np.dot(pair.shift, pair.shift))
            return _times(res, steps, res.reason), lambda: -steps * v2 / noise**3
        why = (
            f"linear class, {steps} steps: reduced exactly to the sum S of the steps (permutation "
            "symmetry), theta = (b, a) for h = b + a S"
        )
        return res._replace(reason=why), lambda: _slope(res, sol, law, noise)
    if pair.dim != 1:
        _fail("pair", pair.label, "must be 1-dimensional here")
    law = pair.law(pair.shift[0] / pair.scale)
    res, sol = _solve(pair, law, pair.scale, name, adversary, degree, a)
    if sol is None:  # Gaussian KL: v^2 / (2 sigma^2) by structure
        v2 = pair.shift[0] ** 2
        res = _times(res, steps, res.reason)
        return res, lambda: -steps * v2 / noise**3
    one_slope = _slope(res, sol, law, noise)
    if case == "single":
        return res, lambda: one_slope
    why = (
        "additive class, KL: the Donsker-Varadhan objective separates over the T independent steps, "
        "so the value is T times one step (paper Theorem 4, with equality)"
    )
    return _times(res, steps, why), lambda: steps * one_slope


def _times(res: ExactResult, steps: int, why: str | None) -> ExactResult:
    return res._replace(
        value=steps * res.value,
        f_value=steps * res.f_value,
        tight_value=steps * res.tight_value,
        reason=why,
    )


def _solve(pair, law, unit, name, adversary, degree, alpha):
    """One certified 1-D solve: (ExactResult, solution dict), or (result, None) when structural."""
    adv = _parse_adversary(adversary, degree)
    if adv.kind == "poly":
        _check_degree(pair, name, adv.degree)
    if _structural(pair, name, adv) is not None:
        res = _restricted_many(pair, name, adversary, degree, [alpha], "abs", 4, 1e-10)[0]
        if not (pair.family == "gaussian" and name == "kl"):
            _fail("pair", pair.label, "has no smooth exact value in the noise here (degenerate)")
        return res, None
    sol = _solve_1d(law, unit, name, adv, [alpha], "abs", 4, 1e-10)[0]
    res = _from_solution(pair, name, adv, alpha, "abs", sol)
    _refuse_uncertified([res])
    if not res.converged:  # a feature map (polynomial classes were refused just above)
        raise InvalidParameterError(
            f"adversary={adversary!r} is invalid here: the exact value could not be certified "
            f"({res.reason})"
        )
    return res, sol


def _slope(result: ExactResult, sol: dict[str, Any], law: _Law1D, noise: float) -> float:
    """dV/ds at the optimum held fixed: E_P[h d_s log p] - E_Q[f*(h) d_s log q] (module docstring)."""
    grid = sol["grid"]
    wp, wq = _exp(grid.lwp), _exp(grid.lwq)
    wp, wq = wp / wp.sum(), wq / wq.sum()
    sp, sq = law.scores(grid.z, noise)
    h = sol["h"]
    if result.divergence == "renyi":
        div = get_divergence("alpha", alpha=result.alpha, convention=result.convention)
    else:
        div = get_divergence(result.divergence)
    conj = _conjugate(div, h)
    live = wq > 0
    d_f = float(wp @ (h * sp) - np.sum(wq[live] * conj[live] * sq[live]))
    if result.divergence == "renyi":
        a = result.alpha
        return a * d_f / (1.0 + a * (a - 1.0) * result.f_value)
    return d_f


def _unrestricted(pair, name, alpha, steps, noise):
    """T times the unrestricted one-step value, with its slope from the score functions."""
    one = unrestricted_divergence(pair, name, alpha=alpha)
    value = steps * one.value
    f_value = steps * one.f_value if name == "kl" else _alpha_from_renyi(value, alpha)
    why = None
    if steps > 1:
        why = "unrestricted: the divergence of a product of T independent steps is T times one step"
    res = one._replace(value=value, f_value=f_value, tight_value=value, reason=why)
    if pair.dim != 1:
        return res, lambda: math.nan

    def slope() -> float:
        law = pair.law(pair.shift[0] / pair.scale)
        z, w = _unrestricted_rule(law, name, alpha)
        lp, lq = law.log_p(z), law.log_q(z)
        sp, sq = law.scores(z, noise)
        lw = np.log(w)
        if name == "kl":
            wp = _exp(lw + lp)
            d = float(wp @ ((lp - lq) * sp) - wp @ sq)
        else:
            lpi = lw + alpha * lp + (1.0 - alpha) * lq
            pi = _exp(lpi - np.max(lpi))
            pi /= pi.sum()
            d = float(pi @ (alpha * sp + (1.0 - alpha) * sq)) / (alpha - 1.0)
        return steps * d

    return res, slope


def _alpha_from_renyi(renyi: float, alpha: float) -> float:
    scaled = (alpha - 1.0) * renyi
    return math.expm1(scaled) / (alpha * (alpha - 1.0)) if scaled < 709.0 else math.inf
