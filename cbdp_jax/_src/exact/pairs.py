"""Pairs of output laws: the noise families the exact layer integrates and the pair constructors.

:class:`NoisePair` is the closed-form description the solver reads (family, scale, shift);
:func:`laplace_pair`, :func:`gaussian_pair`, :func:`subsampled_gaussian_pair` and :func:`point_mass_pair`
build the library's one pair type, :class:`~cbdp_jax.mechanisms.NeighbouringPair`, and
:func:`output_laws` reads a :class:`NoisePair` back from it (docs/theory/mechanisms.md,
docs/theory/subsampled_gaussian.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from cbdp_jax._src import mechanisms as mech
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_choice,
    check_in_range,
    check_positive,
    check_vector,
)

FAMILIES = ("laplace", "gaussian", "point_mass", "subsampled_gaussian")
DIRECTIONS = ("remove", "add")


@dataclasses.dataclass(frozen=True)
class NoisePair:
    """The two output laws of a noise mechanism on neighbouring datasets (docs/theory/mechanisms.md).

    P = family(0, scale)^d and Q = family(shift, scale), coordinatewise independent: Laplace with scale b
    has density exp(-|x|/b) / (2b) per coordinate, Gaussian with scale s is N(0, s^2). The family
    ``'point_mass'`` is the non-private release P = delta_0, Q = delta_shift (``scale`` is 0).

    The family ``'subsampled_gaussian'`` is one step of the Poisson-subsampled Gaussian mechanism with
    sampling rate q: with M = (1 - q) N(0, s^2 I) + q N(v, s^2 I) (the record's contribution v is
    added with probability q) and G = N(0, s^2 I), direction ``'remove'`` (D' = D without the
    record) has P = M, Q = G and ``'add'`` has P = G, Q = M (docs/theory/subsampled_gaussian.md).

    Attributes:
      family: ``'laplace'``, ``'gaussian'``, ``'point_mass'`` or ``'subsampled_gaussian'``.
      scale: The noise scale (1/eps for Laplace, sigma otherwise), > 0; 0 for point masses.
      shift: The per-coordinate shift v of Q (the sensitivity vector), finite; d = len(shift).
      sampling_rate: The subsampled Gaussian's q in (0, 1]; must stay 1.0 for the other families.
      direction: The subsampled Gaussian's ``'remove'`` or ``'add'``.

    """

    family: str
    scale: float
    shift: tuple[float, ...]
    sampling_rate: float = 1.0
    direction: str = "remove"

    def __post_init__(self) -> None:
        check_choice("family", self.family, FAMILIES)
        check_choice("direction", self.direction, DIRECTIONS)
        if self.family == "subsampled_gaussian":
            rate = check_in_range("sampling_rate", self.sampling_rate, 0.0, 1.0, low_open=True)
            object.__setattr__(self, "sampling_rate", rate)
        elif float(self.sampling_rate) != 1.0:
            _fail(
                "sampling_rate",
                self.sampling_rate,
                "must be 1.0 unless family is 'subsampled_gaussian'",
            )
        if self.family == "point_mass":
            if float(self.scale) != 0.0:
                _fail("scale", self.scale, "must be 0 for family 'point_mass'")
            object.__setattr__(self, "scale", 0.0)
        else:
            object.__setattr__(self, "scale", check_positive("scale", self.scale))
        shift = tuple(float(v) for v in check_vector("shift", self.shift))
        object.__setattr__(self, "shift", shift)

    @property
    def dim(self) -> int:
        """The output dimension d = len(shift)."""
        return len(self.shift)

    @property
    def label(self) -> str:
        """E.g. ``'laplace(scale=1, shift=(1))'``."""
        extra = ""
        if self.family == "subsampled_gaussian":
            extra = f", q={self.sampling_rate:g}, {self.direction}"
        shift = ", ".join(f"{v:g}" for v in self.shift)
        return f"{self.family}(scale={self.scale:g}, shift=({shift}){extra})"

    def law(self, delta: float) -> _Law1D:
        """The 1-D law in standardised units with the (signed) shift delta = shift / scale."""
        if self.family != "subsampled_gaussian":
            return _Law1D(self.family, float(delta))
        q = self.sampling_rate
        if q == 1.0:
            weights, centres = (1.0,), (float(delta),)
        else:
            weights, centres = (1.0 - q, q), (0.0, float(delta))
        return _Law1D("mixture", float(delta), weights, centres, self.direction == "remove")


def laplace_pair(
    epsilon: float, sensitivity: float | Sequence[float] = 1.0
) -> mech.NeighbouringPair:
    """The Laplace mechanism's pair: P = Lap(0, 1/eps)^d, Q = Lap(v, 1/eps).

    Args:
      epsilon: The privacy parameter eps > 0 (noise scale 1/eps).
      sensitivity: The shift v, a number (d = 1) or a vector.

    Returns:
      A :class:`~cbdp_jax.mechanisms.NeighbouringPair` (the one pair type: ``estimate`` takes it too;
      its laws for quadrature: :func:`output_laws`).

    Raises:
      InvalidParameterError: If epsilon is not finite and > 0 or the sensitivity is not finite.

    """
    eps = check_positive("epsilon", epsilon)
    return _additive_pair(mech.LaplaceMechanism, {"epsilon": eps}, sensitivity)


def gaussian_pair(
    sigma: float, sensitivity: float | Sequence[float] = 1.0
) -> mech.NeighbouringPair:
    """The Gaussian mechanism's pair: P = N(0, sigma^2 I_d), Q = N(v, sigma^2 I_d).

    Args:
      sigma: The noise standard deviation, > 0.
      sensitivity: The shift v, a number (d = 1) or a vector.

    Returns:
      A :class:`~cbdp_jax.mechanisms.NeighbouringPair` (the one pair type: ``estimate`` takes it too;
      its laws for quadrature: :func:`output_laws`).

    Raises:
      InvalidParameterError: If sigma is not finite and > 0 or the sensitivity is not finite.

    """
    s = check_positive("sigma", sigma)
    return _additive_pair(mech.GaussianMechanism, {"sigma": s}, sensitivity)


def subsampled_gaussian_pair(
    sigma: float,
    sampling_rate: float,
    sensitivity: float | Sequence[float] = 1.0,
    direction: str = "remove",
) -> mech.NeighbouringPair:
    """One step of the Poisson-subsampled Gaussian mechanism (DP-SGD with a summed gradient).

    M = (1 - q) N(0, sigma^2 I) + q N(v, sigma^2 I) against G = N(0, sigma^2 I): direction
    ``'remove'`` gives P = M, Q = G, ``'add'`` gives P = G, Q = M. With ||v||_2 = 1, sigma is DP-SGD's
    noise multiplier.

    Args:
      sigma: The noise standard deviation, > 0.
      sampling_rate: The Poisson sampling rate q in (0, 1].
      sensitivity: The record's contribution v (a number or a vector).
      direction: ``'remove'`` or ``'add'``.

    Returns:
      A :class:`~cbdp_jax.mechanisms.NeighbouringPair` of a ``SubsampledGaussianMechanism`` (its
      laws: :func:`output_laws`, family ``'subsampled_gaussian'``).

    Raises:
      InvalidParameterError: If sigma is not finite and > 0, q is outside (0, 1], the sensitivity is
        not finite, or the direction is unknown.

    References:
      Mironov, Talwar, Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019;
      docs/theory/subsampled_gaussian.md.

    """
    s = check_positive("sigma", sigma)
    v = tuple(float(x) for x in check_vector("sensitivity", sensitivity))
    check_choice("direction", direction, DIRECTIONS)
    mechanism = mech.SubsampledGaussianMechanism(
        sigma=s,
        sampling_rate=sampling_rate,
        sensitivity=tuple(abs(x) for x in v),
        direction=direction,
    )
    one, none = np.asarray(v, np.float64)[None, :], np.zeros((0, len(v)))
    return mech.NeighbouringPair(
        mechanism, *((one, none) if direction == "remove" else (none, one))
    )


def point_mass_pair(shift: float | Sequence[float] = 1.0) -> mech.NeighbouringPair:
    """The non-private release: P = delta_0, Q = delta_shift (paper Lemma 2).

    Args:
      shift: The change v of the released value, a number or a vector.

    Returns:
      A :class:`~cbdp_jax.mechanisms.NeighbouringPair` of a ``NonPrivateRelease`` (its laws:
      :func:`output_laws`, family ``'point_mass'``).

    Raises:
      InvalidParameterError: If the shift is not finite.

    """
    v = tuple(float(x) for x in check_vector("shift", shift))
    mechanism = mech.NonPrivateRelease(sensitivity=tuple(abs(x) for x in v))
    return mech.NeighbouringPair(mechanism, np.zeros(len(v)), np.asarray(v, np.float64))


def noise_pair_from(mechanism: Any) -> NoisePair:
    """The laws of a mechanism's canonical pair, read duck-typed from its attributes.

    Laplace / Gaussian mechanisms are recognised by ``family`` (``'laplace'`` / ``'gaussian'``),
    ``noise_scale`` (1/eps or sigma) and ``sensitivity`` (a tuple of floats); a non-private release by
    ``family == 'nonprivate'`` and ``sensitivity``. The canonical neighbours give f(D) = 0, f(D') = v.

    Args:
      mechanism: For example ``cbdp_jax.mechanisms.LaplaceMechanism(epsilon=1.0)``.

    Returns:
      The pair.

    Raises:
      InvalidParameterError: If the object lacks these attributes or has another family.

    """
    family = getattr(mechanism, "family", None)
    sens = getattr(mechanism, "sensitivity", None)
    if family in ("laplace", "gaussian") and sens is not None:
        scale = getattr(mechanism, "noise_scale", None)
        if scale is None:
            _fail("mechanism", mechanism, "must have a noise_scale attribute")
        return NoisePair(family, float(scale), tuple(sens))
    if family == "nonprivate" and sens is not None:
        return NoisePair("point_mass", 0.0, tuple(check_vector("shift", sens)))
    if family == "subsampled_gaussian" and sens is not None:
        return NoisePair(
            "subsampled_gaussian",
            check_positive("sigma", mechanism.sigma),
            tuple(check_vector("sensitivity", sens)),
            float(mechanism.sampling_rate),
            mechanism.direction,
        )
    raise InvalidParameterError(
        f"mechanism={mechanism!r} is invalid: must be a Laplace, Gaussian or non-private mechanism "
        "(attributes family in {'laplace', 'gaussian', 'nonprivate', 'subsampled_gaussian'}, "
        "noise_scale, sensitivity)"
    )


def _additive_pair(cls, noise: dict, sensitivity) -> mech.NeighbouringPair:
    """The pair M(0) against M(v) of an additive-noise mechanism (v may have negative entries)."""
    v = tuple(float(x) for x in check_vector("sensitivity", sensitivity))
    mechanism = cls(**noise, sensitivity=tuple(abs(x) for x in v))
    return mech.NeighbouringPair(mechanism, np.zeros(len(v)), np.asarray(v, np.float64))


def _answer64(m, dataset) -> np.ndarray:
    """The query answer ``[dim]`` of ``dataset`` in float64 (a shift of 0.1 must not round to float32).

    A plain dataset of the right shape (no query) is read on the host; anything else goes through the
    mechanism's own ``_answer_vector`` under a scoped 64-bit JAX, which also gives its errors.
    """
    if m.query is None and not isinstance(dataset, jax.core.Tracer):
        try:
            answer = np.asarray(dataset, np.float64)
        except (TypeError, ValueError):
            answer = None
        if answer is not None and (answer.shape == (m.dim,) or (answer.shape == () and m.dim == 1)):
            return answer.reshape(m.dim)
    with jax.enable_x64(True):
        return np.asarray(mech._answer_vector(dataset, m.query, m.dim, np.float64), np.float64)


def output_laws(pair: Any) -> NoisePair:
    """The closed-form description of a pair's two output laws, which the exact layer integrates.

    The one pair type of the library is :class:`~cbdp_jax.mechanisms.NeighbouringPair` (what
    :func:`laplace_pair` and the other constructors here return, what ``estimate`` and the sweep
    take). The exact layer reads its laws from it: for Laplace and Gaussian mechanisms (and
    non-private releases) P and Q are the noise law centred at the query answers f(D) and f(D'),
    and every class here is closed under translation, so only the shift v = f(D') - f(D) matters;
    for the subsampled Gaussian the pair must be one record against none (the canonical pair, either
    direction). A mechanism object stands for its canonical pair; a :class:`NoisePair` passes through.

    Raises:
      InvalidParameterError: A mechanism without closed-form laws here, a batched noise parameter, or
        a subsampled-Gaussian pair that is not one record against none.

    """
    if isinstance(pair, NoisePair):
        return pair
    if isinstance(pair, mech.NeighbouringPair):
        return _laws_of(pair)
    if hasattr(pair, "family") and hasattr(pair, "sensitivity"):
        return noise_pair_from(pair)
    raise InvalidParameterError(
        f"pair={pair!r} is invalid: must be a NeighbouringPair (laplace_pair, gaussian_pair, "
        "subsampled_gaussian_pair, point_mass_pair, mechanisms.canonical_pair) or a Laplace / "
        "Gaussian / subsampled Gaussian / non-private mechanism"
    )


def _laws_of(pair: mech.NeighbouringPair) -> NoisePair:
    m = pair.mechanism
    if isinstance(m, mech.SubsampledGaussianMechanism):
        return _subsampled_laws(pair, m)
    if not isinstance(m, (mech.LaplaceMechanism, mech.GaussianMechanism, mech.NonPrivateRelease)):
        _fail(
            "pair",
            m.label,
            "has no closed-form output laws in the exact layer (Laplace, Gaussian, subsampled "
            "Gaussian and non-private releases only); estimate it from samples instead",
        )
    scale = np.asarray(m.noise_scale, np.float64)
    if scale.ndim != 0:
        _fail("pair", m.label, "has a batched noise parameter; the exact layer takes one value")
    f_d, f_d2 = (_answer64(m, d) for d in (pair.dataset, pair.neighbour))
    shift = tuple(float(x) for x in f_d2 - f_d)
    if isinstance(m, mech.NonPrivateRelease):
        return NoisePair("point_mass", 0.0, shift)
    return NoisePair(m.family, float(scale), shift)


def _subsampled_laws(pair: mech.NeighbouringPair, m) -> NoisePair:
    rows = [np.asarray(d, np.float64).reshape(-1, m.dim) for d in (pair.dataset, pair.neighbour)]
    sizes = tuple(r.shape[0] for r in rows)
    if sorted(sizes) != [0, 1]:
        _fail(
            "pair",
            m.label,
            f"has datasets of {sizes[0]} and {sizes[1]} records; the exact layer needs one record "
            "against none (canonical_pair, or subsampled_gaussian_pair)",
        )
    direction = "remove" if sizes[0] == 1 else "add"
    record = rows[0][0] if sizes[0] == 1 else rows[1][0]
    return NoisePair(
        "subsampled_gaussian",
        float(m.sigma),
        tuple(float(x) for x in record),
        m.sampling_rate,
        direction,
    )
