"""The known value an estimate can be compared with: exact where the class allows it, else unrestricted.

For the Laplace and Gaussian mechanisms (canonical pair 0 vs the sensitivity vector):

* the linear class, and the polynomial class on a 1-D release, are linear in their parameters, so the
  exact restricted value D^H is computed (:func:`cbdp_jax.exact.restricted_divergence`): the quantity
  the estimate targets from below;
* for every other class (networks, random features, bounded classes) the unrestricted divergence D
  (quadrature, equal to the closed forms of Table 1) is the reference: a ceiling the estimate stays
  under, labelled as such.

Other mechanisms have no reference here (``None``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from cbdp_jax._src.estimator.adversaries import AdversarySpec
from cbdp_jax._src.infra.validation import InvalidParameterError

EXACT = "exact restricted"
UNRESTRICTED = "unrestricted"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reference:
    """A reference value for an estimate.

    Attributes:
      value: The value, on the estimate's reported scale (Renyi for ``'renyi'``).
      kind: ``'exact restricted'`` (the class's true value) or ``'unrestricted'`` (a ceiling).
      label: A legend label, e.g. ``'exact (linear, Renyi(alpha=2)) = 0.405465'``.

    """

    value: float
    kind: str
    label: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def _pair(mechanism: str, params: dict[str, Any]):
    from cbdp_jax._src import exact

    sens: Sequence[float] | float = params.get("sensitivity") or 1.0
    if mechanism == "laplace":
        return exact.laplace_pair(params.get("epsilon", 1.0), sens)
    if mechanism == "gaussian":
        return exact.gaussian_pair(params.get("sigma", 1.0), sens)
    return None


def reference_for(
    mechanism: str,
    params: dict[str, Any],
    spec: AdversarySpec,
    divergence: str,
    alpha: float | None,
    divergence_label: str,
    *,
    exact_allowed: bool = True,
) -> Reference | None:
    """The reference value of an estimate of ``mechanism`` against class ``spec``.

    Args:
      mechanism: The CLI mechanism name (``'laplace'``, ``'gaussian'``, ...).
      params: Its parameters (``epsilon`` / ``sigma``, ``sensitivity``), as given to the mechanism.
      spec: The adversary class.
      divergence: The divergence name.
      alpha: Its order, for the alpha family.
      divergence_label: The divergence's label, e.g. ``'Renyi(alpha=2)'`` (for the legend).
      exact_allowed: False when the value is to stand beside a bound that is not on ``spec``'s
        D^H (a finite-sample bound on ``B tanh(H / B)``): the unrestricted divergence is given then,
        never the exact value of a class the bound is not on.

    Returns:
      A :class:`Reference`, or None where no reference is known (other mechanisms, or a value that
      cannot be computed here).

    """
    from cbdp_jax._src import exact

    pair = _pair(mechanism, params)
    if pair is None:
        return None
    dim = pair.dim
    exact_class = (
        exact_allowed
        and spec.bound is None
        and (spec.name == "linear" and spec.feature_map is None or spec.name == "poly" and dim == 1)
    )
    if exact_class:
        try:
            res = exact.restricted_divergence(
                pair,
                divergence,
                spec.name,
                degree=spec.degree if spec.name == "poly" else 1,
                alpha=alpha,
            )
        except InvalidParameterError:
            res = None
        if res is not None and math.isfinite(res.value) and res.converged:
            value = float(res.value)
            label = f"exact ({spec.label}, {divergence_label}) = {value:.6g}"
            return Reference(value=value, kind=EXACT, label=label)
    try:
        value = float(exact.unrestricted_divergence(pair, divergence, alpha=alpha).value)
    except InvalidParameterError:
        return None
    label = f"unrestricted {divergence_label} = {value:.6g} (a ceiling for any class)"
    return Reference(value=value, kind=UNRESTRICTED, label=label)
