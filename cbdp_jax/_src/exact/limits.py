"""The largest polynomial degree whose exact value is certified, per noise family and divergence."""

from __future__ import annotations

from typing import Any

from cbdp_jax._src.exact.pairs import FAMILIES, NoisePair
from cbdp_jax._src.infra.validation import _fail, check_choice, check_int_at_least
from cbdp_jax._src.privacy.divergences import DIVERGENCE_NAMES

# The largest polynomial degree whose exact value is certified, per noise family and divergence group
# ('alpha' covers 'renyi' and 'alpha'; 'other' the degenerate 'tv', 'hellinger', 'js', exact 0 at every
# degree). Chosen by measurement: benchmarks/exact_degree_limits.py, docs/theory/exact_solver.md,
# section 5. Above the limit the exact layer refuses (InvalidParameterError naming `degree`).
DEGREE_LIMITS: dict[str, dict[str, int]] = {
    "laplace": {"kl": 7, "alpha": 40, "chi2": 40, "other": 40},
    "gaussian": {"kl": 48, "alpha": 22, "chi2": 22, "other": 48},
    "point_mass": {"kl": 48, "alpha": 48, "chi2": 48, "other": 48},
    "subsampled_gaussian": {"kl": 3, "alpha": 15, "chi2": 15, "other": 15},
}


def _divergence_group(name: str) -> str:
    if name in ("renyi", "alpha"):
        return "alpha"
    return name if name in ("kl", "chi2") else "other"


def degree_limit(family: str, divergence: str) -> int:
    """The largest polynomial degree the exact layer certifies for a noise family and divergence.

    Args:
      family: ``'laplace'``, ``'gaussian'`` or ``'point_mass'``.
      divergence: A divergence name (``'kl'``, ``'renyi'``, ``'alpha'``, ``'chi2'``, ``'tv'``,
        ``'hellinger'``, ``'js'``).

    Returns:
      The limit L: degrees 1..L are solved (and each result certified or refused), above L refused.

    Raises:
      InvalidParameterError: For an unknown family or divergence.

    References:
      docs/theory/exact_solver.md, section 5 (how the limits were measured).

    """
    check_choice("family", family, FAMILIES)
    check_choice("divergence", divergence, DIVERGENCE_NAMES)
    return DEGREE_LIMITS[family][_divergence_group(divergence)]


def _check_degree(pair: NoisePair, name: str, degree: Any) -> int:
    k = check_int_at_least("degree", degree, 1)
    top = DEGREE_LIMITS[pair.family][_divergence_group(name)]
    if k > top:
        _fail(
            "degree",
            degree,
            f"must lie in [1, {top}] for a {pair.family} pair with divergence {name!r}",
            "the largest degree whose exact value float64 quadrature certifies there; "
            "docs/theory/exact_solver.md, section 5",
        )
    return k
