"""Which variational objective trains a class, and how a trained h becomes a member of the plain f-form.

MATH.md section 3: for translation-invariant classes KL is trained with the Donsker-Varadhan form and for
cones the Renyi / alpha divergence with the scale-free form; both are supremum-preserving and
scale-free, and both are biased as sample estimates (a log of a sample mean). The trained direction is
therefore turned back into one fixed function of the plain f-form -- the fitted constant for KL, the
fitted sign and scale for the alpha family -- and only that fixed function is evaluated on held-out data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cbdp_jax._src.adversaries import AdversarySpec
from cbdp_jax._src.divergences import (
    Divergence,
    _log_mean_abs_pow,
    alpha_exponent,
    alpha_optimal_scale,
    donsker_varadhan,
    kl_optimal_shift,
    variational_objective,
)


class Objective(NamedTuple):
    """A training objective and the map from a trained output to the evaluated f-form function.

    Attributes:
      kind: ``'dv'`` (Donsker-Varadhan), ``'renyi_scale_free'`` or ``'fform'``.
      value: ``(h_p [n], h_q [m]) -> scalar`` to maximise.
      fit: ``(h_p_train, h_q_train) -> (scale, shift)``: the evaluated function is
        ``scale * h + shift``, fitted in closed form on training outputs.

    """

    kind: str
    value: Callable[[jax.Array, jax.Array], jax.Array]
    fit: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _identity_fit(h_p, h_q):
    return jnp.ones((), h_p.dtype), jnp.zeros((), h_p.dtype)


def choose_objective(div: Divergence, spec: AdversarySpec, *, tight: bool = True) -> Objective:
    """Picks the tightest valid training objective for the divergence and class (MATH.md section 3)."""
    if tight and div.name == "kl" and spec.translation_invariant:

        def fit(h_p, h_q):
            return jnp.ones((), h_p.dtype), kl_optimal_shift(h_q)

        return Objective("dv", donsker_varadhan, fit)

    if tight and div.name in ("renyi", "alpha") and spec.is_cone and div.convention == "abs":
        alpha = div.alpha
        big_a = alpha_exponent(alpha)

        def value(h_p, h_q):
            # Sign-symmetric: h and -h give the same value under the |t| convention, so training can
            # never get stuck at E_P[h] < 0; the sign is fixed afterwards in `fit`.
            mean_p = jnp.abs(jnp.mean(h_p))
            return big_a * jnp.log(mean_p + 1e-30) - _log_mean_abs_pow(h_q, big_a, "abs")

        def fit(h_p, h_q):
            sign = jnp.where(jnp.mean(h_p) >= 0, 1.0, -1.0).astype(h_p.dtype)
            scale = sign * alpha_optimal_scale(sign * h_p, sign * h_q, alpha, "abs")
            return scale, jnp.zeros((), h_p.dtype)

        return Objective("renyi_scale_free", value, fit)

    def fform(h_p, h_q):
        return variational_objective(div, h_p, h_q)

    return Objective("fform", fform, _identity_fit)
