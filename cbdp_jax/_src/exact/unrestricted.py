"""The unrestricted divergence D(P, Q) = E_Q[f(p/q)] by quadrature in log space."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cbdp_jax._src.exact import quadrature as quad
from cbdp_jax._src.exact.float64 import _x64
from cbdp_jax._src.exact.grids import _EXTENT
from cbdp_jax._src.exact.inputs import _Adversary, _parse_divergence
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.exact.pairs import NoisePair, output_laws
from cbdp_jax._src.exact.result import ExactResult, _result
from cbdp_jax._src.infra.validation import _fail, check_alpha
from cbdp_jax._src.privacy.divergences import Divergence


def _unrestricted_rule(
    law: _Law1D, name: str, alpha: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """The rule for the unrestricted integrals of ``name``: nodes and weights on R."""
    delta = law.delta
    centres = list(law.grid_centres)
    kinks = list(law.kinks)
    if name == "tv":
        kinks.append(0.5 * delta)  # p = q there (also for the subsampled Gaussian's mixture)
    if law.family == "gaussian" and name in ("renyi", "alpha"):
        centres.append((1.0 - alpha) * delta)  # p^a q^(1-a) is a Gaussian centred there
    if law.family == "gaussian" and name == "chi2":
        centres.append(-delta)
    if law.family == "mixture" and name in ("renyi", "alpha", "chi2"):
        # The integrand p^a q^(1-a) is a mixture of Gaussians whose peak can sit far out: locate it.
        a = 2.0 if name == "chi2" else alpha
        reach = 40.0 + 2.0 * (abs(a) + 1.0) * abs(delta)
        coarse = np.linspace(-reach, reach, 8001)
        score = a * law.log_p(coarse) + (1.0 - a) * law.log_q(coarse)
        centres.append(float(coarse[int(np.argmax(score))]))
    # Graded panels at the kinks too: p^a q^(1-a) of a Laplace pair decays like exp(-(2a - 1) z)
    # away from a kink, far faster than the uniform panels resolve for large alpha.
    return quad.rule_1d(centres, kinks, kinks, extent=_EXTENT)


def _unrestricted_parts(law: _Law1D, name: str, alpha: float | None) -> float:
    """One coordinate's contribution in the quantity that adds over coordinates (see callers)."""
    z, w = _unrestricted_rule(law, name, alpha)
    lp = law.log_p(z)
    lq = law.log_q(z)
    lw = np.log(w)
    lse = quad.logsumexp
    if name == "kl":
        return float(np.sum(w * np.exp(lp) * (lp - lq)))
    if name in ("renyi", "alpha"):
        return lse(lw + alpha * lp + (1.0 - alpha) * lq)  # log int p^a q^(1-a)
    if name == "chi2":
        return lse(lw + 2.0 * lp - lq)  # log int p^2 / q
    if name == "hellinger":
        return lse(lw + 0.5 * (lp + lq))  # log int sqrt(p q)
    if name == "tv":
        return float(0.5 * np.sum(w * np.abs(np.exp(lp) - np.exp(lq))))
    lpq = np.logaddexp(lp, lq)
    log2 = math.log(2.0)
    return float(np.sum(w * (np.exp(lp) * (log2 + lp - lpq) + np.exp(lq) * (log2 + lq - lpq))))


@_x64
def unrestricted_divergence(
    pair: NoisePair | Any, divergence: str | Divergence, *, alpha: float | None = None
) -> ExactResult:
    """The unrestricted divergence D(P, Q) = E_Q[f(p/q)] by quadrature in log space.

    Renyi is log(integral p^alpha q^(1-alpha)) / (alpha - 1) with a logsumexp over the nodes. A d-dim
    pair is factorised over coordinates where the divergence allows it: KL and Renyi add, 1 + chi^2 and
    the Bhattacharyya coefficient (Hellinger) multiply; zero-shift coordinates are dropped (they change
    no f-divergence) and a Gaussian pair is reduced to 1-D with shift ||v||_2 (rotation invariance).
    Total variation and Jensen-Shannon of a Laplace pair with two or more shifted coordinates are not
    supported.

    Args:
      pair: A :class:`NoisePair` (or a mechanism object).
      divergence: A divergence name or :class:`~cbdp_jax.divergences.Divergence`.
      alpha: The order for ``'renyi'`` / ``'alpha'`` (> 1); must be None otherwise.

    Returns:
      An :class:`ExactResult` with ``adversary='unrestricted'`` and an empty ``theta``. Distinct point
      masses give +inf for KL, Renyi, alpha and chi^2 and 1, 2, 2 log 2 for TV, Hellinger^2, JS.

    Raises:
      InvalidParameterError: For bad inputs, or TV / JS of a Laplace pair with > 1 shifted coordinate.

    Examples:
      >>> from cbdp_jax.exact import gaussian_pair
      >>> round(unrestricted_divergence(gaussian_pair(1.0), "renyi", alpha=3.0).value, 12)
      1.5

    """
    pair = output_laws(pair)
    name, _ = _parse_divergence(divergence, alpha, "abs")
    if isinstance(divergence, Divergence) and alpha is None:
        alpha = divergence.alpha
    a = check_alpha(alpha) if name in ("renyi", "alpha") else None
    adv = _Adversary("unrestricted", None, None)
    empty = np.zeros(0)

    def done(f_value: float, reason: str | None = None, value: float | None = None) -> ExactResult:
        return _result(
            pair,
            name,
            adv,
            a,
            "abs",
            f_value=f_value,
            theta=empty,
            converged=True,
            reason=reason,
            value=value,
        )

    v = np.asarray(pair.shift)
    if np.all(v == 0):
        return done(0.0, "P = Q (zero shift): every divergence is 0")
    if pair.family == "point_mass":
        singular = {"tv": 1.0, "hellinger": 2.0, "js": 2.0 * math.log(2.0)}
        if name in singular:
            return done(singular[name], "P and Q are mutually singular: f(0) + f'(inf)")
        return done(
            math.inf, "P and Q are mutually singular (P is not absolutely continuous wrt Q)"
        )
    deltas = np.abs(v[v != 0]) / pair.scale
    if pair.family in ("gaussian", "subsampled_gaussian"):
        deltas = np.array([float(np.linalg.norm(deltas))])
    if name in ("tv", "js") and deltas.size > 1:
        _fail(
            "pair",
            pair.label,
            f"{name} of a Laplace pair is supported with one shifted coordinate",
            "it does not factorise over coordinates",
        )
    parts = [_unrestricted_parts(pair.law(float(dl)), name, a) for dl in deltas]
    total = math.fsum(parts)
    if name in ("kl", "tv", "js"):
        return done(total)
    if name == "chi2":
        return done(math.expm1(total) if total < 709.0 else math.inf)
    if name == "hellinger":
        return done(-2.0 * math.expm1(total))
    renyi = total / (a - 1.0)
    scaled = (a - 1.0) * renyi
    f_alpha = math.expm1(scaled) / (a * (a - 1.0)) if scaled < 709.0 else math.inf
    if name == "renyi":
        return done(f_alpha, value=renyi)
    return done(f_alpha)
