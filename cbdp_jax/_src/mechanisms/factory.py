"""Mechanisms by name: :func:`make_mechanism`."""

from __future__ import annotations

from typing import Any

from cbdp_jax._src.infra.validation import (
    _fail,
    check_choice,
    check_vector,
)
from cbdp_jax._src.mechanisms.additive import GaussianMechanism, LaplaceMechanism
from cbdp_jax._src.mechanisms.base import MECHANISM_NAMES, Mechanism
from cbdp_jax._src.mechanisms.discrete import NonPrivateRelease, RandomizedResponse
from cbdp_jax._src.mechanisms.subsampled import SubsampledGaussianMechanism

_FACTORY_PARAMS = {
    "laplace": ("epsilon", "sensitivity"),
    "gaussian": ("sigma", "sensitivity"),
    "randomized_response": ("epsilon", "k"),
    "nonprivate": ("sensitivity", "dim"),
    "subsampled_gaussian": ("sigma", "sampling_rate", "sensitivity", "direction"),
}
_REQUIRED = {
    "laplace": ("epsilon",),
    "gaussian": ("sigma",),
    "randomized_response": ("epsilon",),
    "subsampled_gaussian": ("sigma", "sampling_rate"),
}


def make_mechanism(name: str, **params: Any) -> Mechanism:
    """Builds a mechanism by name (for the command line).

    Args:
      name: One of ``MECHANISM_NAMES``: ``'laplace'`` (epsilon, sensitivity), ``'gaussian'`` (sigma,
        sensitivity), ``'randomized_response'`` (epsilon, k), ``'nonprivate'`` (sensitivity, dim),
        ``'subsampled_gaussian'`` (sigma, sampling_rate, sensitivity, direction).
      **params: The parameters listed for the name. A parameter whose value is None counts as not
        given, so a CLI can pass every option it has.

    Returns:
      The mechanism.

    Raises:
      InvalidParameterError: For an unknown name (listing the valid ones), a parameter the mechanism
        does not take, a missing required parameter, or a value out of range.

    Examples:
      >>> make_mechanism("laplace", epsilon=0.5, sensitivity=[1, 1]).label
      'Laplace(eps=0.5, v=(1, 1))'
      >>> make_mechanism("gaussian", sigma=2.0, epsilon=None).label
      'Gaussian(sigma=2, v=(1))'

    """
    check_choice("mechanism", name, MECHANISM_NAMES)
    given = {k: v for k, v in params.items() if v is not None}
    allowed = _FACTORY_PARAMS[name]
    for key in given:
        if key not in allowed:
            _fail(
                key, given[key], f"is not a parameter of {name!r} (it takes: {', '.join(allowed)})"
            )
    for key in _REQUIRED.get(name, ()):
        if key not in given:
            _fail(key, None, f"must be given for mechanism {name!r}")
    if "sensitivity" in given:
        given["sensitivity"] = tuple(check_vector("sensitivity", given["sensitivity"]))
    cls = {
        "laplace": LaplaceMechanism,
        "gaussian": GaussianMechanism,
        "randomized_response": RandomizedResponse,
        "nonprivate": NonPrivateRelease,
        "subsampled_gaussian": SubsampledGaussianMechanism,
    }[name]
    return cls(**given)
