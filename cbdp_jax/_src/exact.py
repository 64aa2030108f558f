"""Exact restricted and unrestricted divergences for known noise laws (quadrature + a concave solver).

For a class H linear in its parameters, h_theta(x) = theta . phi~(x) with phi~ = (1, phi), the restricted
f-divergence is the supremum of a concave function of theta (docs/theory/mechanisms.md, last paragraph):

    D_f^H(P, Q) = sup_theta  E_P[h_theta] - E_Q[f*(h_theta)].

Both expectations are computed here by deterministic float64 quadrature (:mod:`quadrature`: composite
Gauss-Legendre split at the density kinks and at the roots of h, geometric tails), and the supremum by a
damped Newton method with backtracking line search written in JAX (``lax.while_loop``, ``jax.hessian``),
vmapped over several starting points and over a batch of problems (e.g. a grid of Renyi orders), keeping
the best start. The solver works with the tighter, equivalent forms of docs/theory/objectives.md:

* KL (H contains constants): the Donsker-Varadhan form  sup_u E_P[u.phi] - log E_Q[exp(u.phi)], concave;
  the optimal constant is then b = 1 - log E_Q[exp(u.phi)].
* alpha-divergence / Renyi (H is a cone): fixing the scale by E_P[h] = 1 (any h with E_P[h] > 0 can be
  rescaled), the scale-free form becomes  D_R^H = -log min_u E_Q[|1 + u.(phi - E_P phi)|^A],
  A = alpha / (alpha - 1): a *convex* minimisation (|.|^A is convex, h is affine in u), unlike the
  scale-free form itself. The scale t* of the plain f-form is then closed form
  (``divergences.alpha_optimal_scale``).
* Pearson chi^2, squared Hellinger, Jensen-Shannon: the plain f-form (concave).

The reported ``value`` is the solver's tight form at the optimum, evaluated on normalised quadrature
weights with log1p / expm1 (so values down to ~1e-7 keep ~1e-13 relative accuracy); ``f_value`` is the
plain f-form E_P[h*] - E_Q[f*(h*)] with the project's :class:`~cbdp_jax.divergences.Divergence`
conjugate at the same h*. They agree at the optimum (tested).

Polynomial (and 1-D linear) classes are parametrised by polynomials orthonormal under (P + Q) / 2, rebuilt
between rounds under the Hessian's weight for the alpha family, solved degree by degree, and certified:
a Newton decrement below ``GAP_TOL``, monotonicity in the degree, and the quadrature checks. Degrees above
``DEGREE_LIMITS`` are refused, and (``strict``) so is a value that fails its certificate; the Gaussian KL
is exact by structure at every degree. See docs/theory/exact_solver.md. The Poisson-subsampled Gaussian
pair (both directions) is a family here too (docs/theory/subsampled_gaussian.md).

Domains (where E_Q[f*(h)] is finite). Only KL has an unbounded-above conjugate that grows faster than
every polynomial, so only KL needs care: E_Q[exp(h)] is finite iff
  - Laplace, linear h = a x + b: |a| < eps (per unit scale: |u| < 1 in standardised units);
  - polynomial of degree k: an odd leading coefficient of degree >= 3 must be 0 (so poly_k KL for odd
    k >= 3 equals poly_{k-1} KL: the solver fixes that coefficient to 0 and reports it as 0), and an even
    leading coefficient must be < 0 (Gaussian degree 2: < 1 / (2 s^2));
  - a user feature map: assumed finite (true for bounded features such as random Fourier features).
The domain is open and the objective tends to -inf at its boundary, so the Newton iterates are kept
inside by rejecting infeasible trial points in the line search (no barrier needed). For Renyi / alpha
every polynomial has finite moments under both noise laws, so no constraint arises. For total variation,
squared Hellinger and Jensen-Shannon f* is +inf above a finite level, so no non-constant polynomial h on R
is admissible and the restricted value is 0 (docs/theory/mechanisms.md: degenerate); for a user feature map the
level constraint is enforced on every quadrature node.

Supported shapes: 1-D pairs with any adversary; d-dimensional pairs (independent coordinates) with the
linear class: KL and chi^2 decompose into a sum over coordinates; Renyi does not decompose -- Gaussian
pairs reduce exactly to 1-D with sensitivity ||v||_2 (rotation invariance), Laplace pairs are solved by
nested 2-D quadrature when at most two coordinates have a non-zero shift (zero-shift coordinates can be
dropped: by reflection symmetry and convexity their optimal coefficient is 0); more raise.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019: eq. (1)-(4),
  Lemma 1, Lemma 2, Table 1, Figures 1-2. docs/theory/divergences.md, objectives.md, capacity_bounded_dp.md and mechanisms.md.

"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cbdp_jax._src import mechanisms as mech
from cbdp_jax._src import orthopoly
from cbdp_jax._src import quadrature as quad
from cbdp_jax._src.divergences import (
    DIVERGENCE_NAMES,
    Divergence,
    alpha_from_renyi,
    get_divergence,
    renyi_from_alpha,
)
from cbdp_jax._src.validation import (
    InvalidParameterError,
    _fail,
    check_alpha,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
    check_vector,
)

FAMILIES = ("laplace", "gaussian", "point_mass", "subsampled_gaussian")
DIRECTIONS = ("remove", "add")
ADVERSARIES = ("linear", "poly")

_KL_EXTENT = 2.0**24  # tail reach (scale units) for KL: E_Q[exp(a x)] decays like exp(-(1 - |u|) z)
_EXTENT = 512.0  # tail reach for everything else: integrands decay at least like exp(-z)
_LIN_KL_MARGIN = (
    1e-5  # Laplace lin KL keeps |u| <= 1 - margin (accurate tails need (1-|u|) extent >> 1)
)
_MAX_ROUNDS = 8  # grid-refinement rounds (roots of h and integrand modes move with theta)
_MAX_ITER = 100  # Newton iterations per round
_ROUND0_ITER = 25  # Newton iterations on the first (unsplit) grid
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

GAP_TOL = 1e-10  # converged needs newton_decrement^2 / 2 <= GAP_TOL (1 + |value|)
_MONOTONE_TOL = 1e-9  # value(k) >= value(k - 1) - tol * (1 + |value(k - 1)|) certifies monotonicity
_M_PAD = 4  # parameter vectors are padded to this length (one compilation for lin, poly_2, poly_3)
_N_BUCKET = 4096  # node counts are padded to a power of two >= this (fewer recompilations)


# --------------------------------------------------------------------------------------------------
# The pair of output laws
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


class ExactResult(NamedTuple):
    """An exact (quadrature) divergence value with its optimiser and the inputs that produced it.

    Attributes:
      value: The divergence on the reported scale (Renyi for ``'renyi'``): the solver's tight form at
        the optimum (equal to the plain f-form there, computed with less cancellation). ``+inf`` for
        separable pairs, never NaN.
      f_value: The plain f-form at the optimum on the f-divergence scale (the alpha-divergence for
        ``'renyi'``).
      theta: The optimal parameters in the original units, ``theta[0]`` the constant, then one
        coefficient per feature (linear: a_1..a_d; poly: the coefficients of x, x^2, ..., x^k; a feature
        map: its columns), for the plain f-form. Empty where no optimum exists (``+inf``, unrestricted).
      converged: Whether the solver met its tolerance and the quadrature checks passed.
      reason: Why the value is +inf or 0 by a structural argument, or why ``converged`` is False; None
        otherwise.
      tight_value: The value of the solver's tighter form (Donsker-Varadhan / scale-free Renyi) on the
        reported scale; equals ``value`` at the optimum.
      pair: The pair of laws.
      divergence: The divergence name.
      adversary: ``'linear'``, ``'poly'``, ``'feature_map'`` or ``'unrestricted'``.
      degree: The polynomial degree (1 for linear, None for a feature map or unrestricted).
      alpha: The order for ``'renyi'`` / ``'alpha'``, else None.
      convention: The alpha-divergence convention (``'abs'`` or ``'nonneg'``).
      gradient_norm: The Euclidean norm of the gradient of the solver's objective (Renyi scale for the
        alpha family, Donsker-Varadhan for KL, the f-form otherwise) at the returned optimum, in the
        coordinates the solver ends in -- for linear and polynomial classes polynomials orthonormal
        under (P + Q) / 2 (KL, chi^2) or under the weight of the objective's Hessian (alpha family).
        0.0 where the value is exact by a structural argument; None where no solve ran.
      newton_decrement: The certificate's first part: sqrt(g^T C^+ g) with g that gradient and C the
        objective's curvature there; decrement^2 / 2 estimates how far the value can still be below
        the supremum. ``converged`` requires decrement^2 / 2 <= ``GAP_TOL`` (1 + |value|) (and a
        finite decrement: no gradient along a direction without curvature). Same None / 0.0 cases.
      monotone_checked: The certificate's second part (polynomial and linear classes): True when the
        value was checked to be >= ``previous_value`` - 1e-9 (1 + |previous_value|); the classes nest,
        so a smaller value would prove the solve wrong (``converged`` is then False). False where no
        comparison applies (feature maps, d > 1, structural values, unrestricted).
      previous_value: The value of the next smaller class it was compared with (degree k - 1; for KL
        the previous even degree, or linear; 0 for the constants below degree 1), else None.

    """

    value: float
    f_value: float
    theta: np.ndarray
    converged: bool
    reason: str | None
    tight_value: float
    pair: NoisePair
    divergence: str
    adversary: str
    degree: int | None
    alpha: float | None
    convention: str
    gradient_norm: float | None = None
    newton_decrement: float | None = None
    monotone_checked: bool = False
    previous_value: float | None = None

    def __float__(self) -> float:
        """``float(result)`` is ``result.value`` (the reported-scale divergence)."""
        return float(self.value)


def _x64(fn: Callable) -> Callable:
    """Runs ``fn`` with float64 enabled (the exact layer needs it; the caller's setting is restored)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------------------------------
# Quadrature geometries: where the nodes are, and the features on them
# --------------------------------------------------------------------------------------------------


class _Grid(NamedTuple):
    """Quadrature nodes with log weights under P and Q and the solver's features on them."""

    z: np.ndarray  # [N] (1-D) or [N, 2] (2-D), standardised units
    lwp: np.ndarray  # [N] log(weight * p)
    lwq: np.ndarray  # [N] log(weight * q)
    phi: np.ndarray  # [N, m] features (solver units)
    edge_mask: np.ndarray  # [N] nodes in the outermost tail panels (tail-mass check)
    guard_lw: np.ndarray | None = (
        None  # [G] pseudo log weights of probe points beyond the rule (KL)
    )
    guard_phi: np.ndarray | None = None  # [G, m] features at the probe points
    guard_z: np.ndarray | None = None  # [G] the probe points

    def with_features(self, features: Callable[[np.ndarray], np.ndarray]) -> _Grid:
        """The same nodes and weights with the features recomputed (after a change of basis)."""
        guard_phi = None if self.guard_z is None else features(self.guard_z)
        return self._replace(phi=features(self.z), guard_phi=guard_phi)


def _exp(x: np.ndarray) -> np.ndarray:
    """exp(x) with results below 1e-300 flushed to 0 (subnormal arithmetic is ~100x slower)."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(np.where(x > -690.0, x, -np.inf))


def _log_weights(w: np.ndarray, logdens: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(w) + logdens


@dataclasses.dataclass(frozen=True)
class _Law1D:
    """The two laws of a 1-D problem in standardised units (hashable: caches key on it).

    ``'laplace'`` / ``'gaussian'``: P = F(0, 1), Q = F(delta, 1). ``'mixture'``: one side is the mixture
    sum_j weights_j N(centres_j, 1) and the other N(0, 1) (P is the mixture when ``mixture_is_p``): the
    Poisson-subsampled Gaussian (two components) and the law of its T-step sum (a binomial mixture).
    ``delta`` is then the largest centre, the problem's length scale.
    """

    family: str
    delta: float
    weights: tuple[float, ...] = ()
    centres: tuple[float, ...] = ()
    mixture_is_p: bool = True

    @property
    def tails(self) -> str:
        """``'laplace'`` (exponential tails) or ``'gaussian'``."""
        return "laplace" if self.family == "laplace" else "gaussian"

    @property
    def kinks(self) -> list[float]:
        return [0.0, self.delta] if self.family == "laplace" else []

    @property
    def grid_centres(self) -> list[float]:
        """Points the uniform panels must cover (at most 6 units apart, so no gap opens)."""
        if self.family != "mixture":
            return [0.0, self.delta]
        top = max(self.centres)
        return [0.0, *np.arange(min(self.centres), top, 6.0).tolist(), top]

    def _log_mixture(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        c = np.asarray(self.centres)
        lw = np.log(np.asarray(self.weights))
        terms = lw[None, :] - 0.5 * (z[:, None] - c[None, :]) ** 2
        top = np.max(terms, axis=1)
        return top + np.log(np.sum(np.exp(terms - top[:, None]), axis=1)) - quad._LOG_SQRT_2PI

    def _mixture_score(self, z: np.ndarray, noise: float) -> np.ndarray:
        c = np.asarray(self.centres)
        terms = np.log(np.asarray(self.weights))[None, :] - 0.5 * (z[:, None] - c[None, :]) ** 2
        resp = np.exp(terms - np.max(terms, axis=1, keepdims=True))
        resp /= resp.sum(axis=1, keepdims=True)
        return np.sum(resp * ((z[:, None] - c[None, :]) ** 2 - 1.0), axis=1) / noise

    def scores(self, z: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
        """d/ds log p and d/ds log q at x = scale z, s the noise parameter (epsilon or sigma).

        The shift in standardised units moves with s (delta = eps v or v / sigma), and so does the
        scale; both are accounted for by differentiating the density in x at fixed x: Laplace with
        rate eps: (1 - |z - c|) / eps; Gaussian with sigma: ((z - c)^2 - 1) / sigma, averaged over
        the components with their posterior weights for a mixture (docs/theory/calibration.md).
        """
        z = np.asarray(z, dtype=np.float64)
        if self.family == "laplace":
            return (1.0 - np.abs(z)) / noise, (1.0 - np.abs(z - self.delta)) / noise
        if self.family == "gaussian":
            return (z * z - 1.0) / noise, ((z - self.delta) ** 2 - 1.0) / noise
        mix, plain = self._mixture_score(z, noise), (z * z - 1.0) / noise
        return (mix, plain) if self.mixture_is_p else (plain, mix)

    def log_p(self, z: np.ndarray) -> np.ndarray:
        if self.family != "mixture":
            return quad.log_density(self.family, z, 0.0)
        if self.mixture_is_p:
            return self._log_mixture(z)
        return quad.log_density("gaussian", z, 0.0)

    def log_q(self, z: np.ndarray) -> np.ndarray:
        if self.family != "mixture":
            return quad.log_density(self.family, z, self.delta)
        if self.mixture_is_p:
            return quad.log_density("gaussian", z, 0.0)
        return self._log_mixture(z)


@dataclasses.dataclass
class _Geometry1D:
    """A 1-D pair in standardised units (P, Q from a :class:`_Law1D`), features phi(z) -> [n, m]."""

    law: _Law1D
    features: Callable[[np.ndarray], np.ndarray]
    extent: float
    half_width: float = 12.0  # uniform panels this far around each centre (grows with the degree)
    guard: bool = False  # KL with a polynomial of degree >= 2: probe the far tails (see _guard)

    @property
    def delta(self) -> float:
        return self.law.delta

    def grid(self, roots: Sequence[float] = (), centres: Sequence[float] = ()) -> _Grid:
        z, w = quad.rule_1d(
            [*self.law.grid_centres, *centres],
            self.law.kinks,
            roots,
            extent=self.extent,
            width=0.5,
            half_width=self.half_width,
        )
        lo, hi = z[0], z[-1]
        span = max(1.0, 0.05 * self.extent)
        edge = (z < lo + span) | (z > hi - span)
        guard_lw = guard_phi = guard_z = None
        if self.guard:
            guard_z, guard_lw, guard_phi = self._guard(lo, hi)
        return _Grid(
            z,
            _log_weights(w, self.law.log_p(z)),
            _log_weights(w, self.law.log_q(z)),
            self.features(z),
            edge,
            guard_lw,
            guard_phi,
            guard_z,
        )

    def _guard(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Probe points beyond the rule's range, where E_Q[exp h] could still blow up unseen.

        A polynomial h with a tiny negative leading coefficient can rise far beyond the last node
        before it turns down; the rule then reports a finite E_Q[exp h] although the true one is
        astronomically large. The probes sit at geometric distances (ratio 1.25) out to where the
        features would overflow, each with pseudo log weight log q(z) + log(0.25 |z|) (the width of
        a panel there); the solver treats a point whose exp(h) q exceeds 1e-12 of E_Q[exp h] at any
        probe as outside the domain (docs/theory/exact_solver.md, section 3).
        """
        reach = max(abs(lo), abs(hi))
        probe = self.features(np.array([reach]))
        k = max(probe.shape[1], 1)
        far = min(1e12, reach * math.exp(min(600.0 / k, 60.0)))
        n = max(1, int(math.log(far / reach) / math.log(1.25)))
        r = reach * 1.25 ** np.arange(1, n + 1)
        z = np.concatenate([-r, r])
        lq = self.law.log_q(z) + np.log(0.25 * np.abs(z))
        with np.errstate(over="ignore", invalid="ignore"):
            phi = self.features(z)
        ok = np.all(np.isfinite(phi), axis=1)
        return z[ok], lq[ok], phi[ok]

    def initial_grid(self) -> _Grid:
        return self.grid()

    def refined_grid(self, prob: _Problem, u: np.ndarray, grid: _Grid) -> _Grid:
        """A grid split at the roots of h (alpha family) and centred also on the integrand's mode."""
        log_q = self.law.log_q(grid.z)
        roots: np.ndarray = np.zeros(0)
        if prob.kind.startswith("renyi"):
            mu = prob.mu_p(grid)

            def h_fn(z: np.ndarray) -> np.ndarray:
                return 1.0 + (self.features(z) - mu) @ u

            hz = h_fn(grid.z)
            with np.errstate(divide="ignore"):
                score = log_q + prob.A * np.log(np.abs(hz))
            roots = _relevant_roots(grid.z, score, quad.sign_change_roots(grid.z, hz, h_fn))
        elif prob.kind == "dv":
            score = log_q + grid.phi @ u
        else:
            return self.grid()
        mode = float(grid.z[int(np.argmax(score))])
        return self.grid(roots, [mode])


def _relevant_roots(z: np.ndarray, score: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Roots of h where the integrand is not negligible (within exp(-46) of its peak nearby).

    Splitting at a root only pays where the integrand has mass; roots in the far tails (or near 1e14
    for a tiny leading coefficient, docs/theory/mechanisms.md pitfall) would only add nodes.
    """
    if roots.size == 0:
        return roots
    top = np.max(score)
    lo = np.searchsorted(z, roots - 1.0)
    hi = np.searchsorted(z, roots + 1.0)
    keep = np.array(
        [hi_ > lo_ and np.max(score[lo_:hi_]) > top - 46.0 for lo_, hi_ in zip(lo, hi, strict=True)]
    )
    return roots[keep]


@dataclasses.dataclass
class _Geometry2D:
    """A 2-D Laplace pair (both coordinates shifted) for the linear class, nested quadrature.

    The root set of h = 1 + u.(z - mu) is a line. With k the coordinate of largest |u_k| (inner) and o the
    other (outer), for each outer node z_o the inner 1-D rule is split at the root
    z_k = mu_k - (1 + u_o (z_o - mu_o)) / u_k; the outer rule is split where that root crosses the inner
    density kinks (0 and delta_k), where the inner integral is less smooth.
    """

    deltas: tuple[float, float]
    extent: float = 64.0  # |h|^A Laplace tails: exp(-z) times a power of z; 64 units is e^-64
    n: int = 6  # Gauss-Legendre points per panel (2-D needs far fewer nodes than 1-D: agreement
    grade: int = 10  # with an independent 1-D reduction is ~1e-12 at these settings, see the tests)

    def _rule(self, coord: int, roots: Sequence[float] = (), grade: int = 8):
        d = self.deltas[coord]
        return quad.rule_1d(
            [0.0, d], [0.0, d], roots, extent=self.extent, width=1.0, n=self.n, grade=grade
        )

    def _assemble(self, z: np.ndarray, w: np.ndarray) -> _Grid:
        d = np.asarray(self.deltas)
        lp = quad.log_density("laplace", z, 0.0).sum(axis=1)
        lq = quad.log_density("laplace", z - d[None, :], 0.0).sum(axis=1)
        reach = np.max(np.abs(z - 0.5 * d[None, :]), axis=1)
        edge = reach > reach.max() - max(1.0, 0.05 * self.extent)
        return _Grid(z, _log_weights(w, lp), _log_weights(w, lq), z.copy(), edge)

    def initial_grid(self) -> _Grid:
        z1, w1 = self._rule(0)
        z2, w2 = self._rule(1)
        z = np.stack(np.meshgrid(z1, z2, indexing="ij"), axis=-1).reshape(-1, 2)
        w = np.outer(w1, w2).ravel()
        return self._assemble(z, w)

    def refined_grid(self, prob: _Problem, u: np.ndarray, grid: _Grid) -> _Grid:
        k = int(np.argmax(np.abs(u)))
        o = 1 - k
        if abs(u[k]) < 1e-300:
            return self.initial_grid()
        mu = prob.mu_p(grid)
        special: list[float] = []
        if abs(u[o]) > 0.0:
            for c in (0.0, self.deltas[k]):
                special.append(mu[o] - (1.0 + u[k] * (c - mu[k])) / u[o])
        zo, wo = self._rule(o, special)
        base = quad.base_edges(
            [0.0, self.deltas[k]],
            [0.0, self.deltas[k]],
            half_width=12.0,
            width=1.0,
            extent=self.extent,
        )
        roots = mu[k] - (1.0 + u[o] * (zo - mu[o])) / u[k]
        roots = np.clip(roots, base[0], base[-1])
        graded = quad.graded_edges(roots, width=1.0, levels=self.grade).reshape(roots.size, -1)
        edges = np.sort(np.concatenate([np.broadcast_to(base, (zo.size, base.size)), graded], 1), 1)
        edges = np.clip(edges, base[0], base[-1])
        zk, wk = quad.rule_from_edges(edges, self.n)  # [n_o, K * n]
        z = np.empty((zk.size, 2))
        z[:, k] = zk.ravel()
        z[:, o] = np.repeat(zo, zk.shape[1])
        w = (wo[:, None] * wk).ravel()
        keep = w > 0
        return self._assemble(z[keep], w[keep])


# --------------------------------------------------------------------------------------------------
# Problems and the batched Newton solver (JAX)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Problem:
    """One concave maximisation, written as a convex minimisation F(u) for the solver.

    kind:
      'renyi_abs' / 'renyi_nonneg': F(u) = E_Q[|h|^A] (or h_+^A), h = 1 + u.(phi - E_P phi).
      'dv': F(u) = log E_Q[exp(u.phi)] - u.E_P[phi].
      'fform': F(theta) = -(E_P[theta.phi] - E_Q[f*(theta.phi)]), phi containing a constant column.
    """

    kind: str
    fname: str  # the divergence name ('renyi', 'alpha', 'kl', 'chi2', 'hellinger', 'js')
    alpha: float | None
    A: float
    convention: str
    geometry: Any
    lo: np.ndarray
    hi: np.ndarray
    starts: np.ndarray  # [S, m]
    to_theta: Callable[[np.ndarray], np.ndarray]  # standardised parameters -> original units
    # Polynomial classes: (u, grid) -> (u, grid) in a basis adapted to the objective at u.
    rebase: Callable[[np.ndarray, _Grid], tuple[np.ndarray, _Grid]] | None = None
    basis_ref: Any = None  # polynomial classes: the current basis (a _BasisRef)

    def mu_p(self, grid: _Grid) -> np.ndarray:
        return _exp(grid.lwp) @ grid.phi

    def solver_data(self, grid: _Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mu = self.mu_p(grid)
        if self.kind.startswith("renyi"):
            return grid.phi - mu[None, :], grid.lwq, mu
        return grid.phi, grid.lwq, mu


def _objective(kind: str, fname: str | None, phi, lw, mu, a_exp, u):
    if kind == "renyi_abs":
        h = 1.0 + phi @ u
        base = jnp.maximum(jnp.abs(h), 1e-300)
        return jnp.sum(jnp.exp(lw + a_exp * jnp.log(base)))
    if kind == "renyi_nonneg":
        h = 1.0 + phi @ u
        pos = h > 0
        base = jnp.where(pos, h, 1.0)
        return jnp.sum(jnp.where(pos, jnp.exp(lw + a_exp * jnp.log(base)), 0.0))
    if kind == "dv":
        return jax.scipy.special.logsumexp(lw + phi @ u) - mu @ u
    conj = get_divergence(fname).conjugate
    valid = jnp.isfinite(lw)
    h = jnp.where(valid, phi @ u, 0.0)
    return -(mu @ u - jnp.sum(jnp.where(valid, jnp.exp(lw) * conj(h), 0.0)))


_EDGE_LOG_MASS = math.log(1e-12)  # DV: the tilted law may put at most this much on the edge panels


def _feasible(kind: str, fname: str | None, phi, lw, lo, hi, edge, guard_phi, guard_lw, u):
    """Whether u lies in the (numerical) domain of the objective.

    For KL the true domain of E_Q[exp h] is open and its boundary is where h stops decaying in the
    tails; a truncated quadrature rule cannot see the blow-up there, so a point whose tilted law
    exp(h) q / E_Q[exp h] puts more than 1e-12 of its mass on the outermost panels counts as outside
    (docs/theory/exact_solver.md, section 3).
    """
    ok = jnp.all((u > lo) & (u < hi))
    if kind == "dv":
        s = lw + phi @ u
        lse = jax.scipy.special.logsumexp
        total = lse(s)
        ok = ok & (lse(jnp.where(edge, s, -jnp.inf)) - total < _EDGE_LOG_MASS)
        ok = ok & (jnp.max(guard_lw + guard_phi @ u) - total < _EDGE_LOG_MASS)
    if kind == "fform":
        sup = get_divergence(fname).conjugate_sup
        if math.isfinite(sup):
            valid = jnp.isfinite(lw)
            ok = ok & jnp.all(jnp.where(valid, phi @ u < sup, True))
    return ok


def _derivatives(kind: str, fname: str | None, phi, lw, mu, a_exp, u):
    """The gradient and Hessian of the objective.

    Closed forms for the alpha family and DV (a smaller program to compile than nested autodiff);
    autodiff for the plain f-forms.
    """
    if kind in ("renyi_abs", "renyi_nonneg"):
        h = 1.0 + phi @ u
        if kind == "renyi_abs":
            base = jnp.maximum(jnp.abs(h), 1e-300)
            t = jnp.exp(lw + a_exp * jnp.log(base))  # w q |h|^A
        else:
            pos = h > 0
            t = jnp.where(pos, jnp.exp(lw + a_exp * jnp.log(jnp.where(pos, h, 1.0))), 0.0)
        h_safe = jnp.where(jnp.abs(h) < 1e-100, 1e-100, h)  # h^2 must not underflow to 0
        g = a_exp * phi.T @ (t / h_safe)
        hm = a_exp * (a_exp - 1.0) * (phi * (t / h_safe**2)[:, None]).T @ phi
        return g, hm
    if kind == "dv":
        s = lw + phi @ u
        pi = jnp.exp(s - jax.scipy.special.logsumexp(s))  # the tilted law exp(h) q / E_Q[exp h]
        m1 = phi.T @ pi
        return m1 - mu, (phi * pi[:, None]).T @ phi - jnp.outer(m1, m1)

    def obj(v):
        return _objective(kind, fname, phi, lw, mu, a_exp, v)

    return jax.grad(obj)(u), jax.hessian(obj)(u)


def _newton_lane(
    kind, fname, max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
):
    """Damped Newton with backtracking from one start; returns (u, F(u), converged, iterations).

    ``active`` marks the real parameters; padded ones (zero features) get a unit Hessian entry and
    never move.
    """

    def safe_f(u):
        val = _objective(kind, fname, phi, lw, mu, a_exp, u)
        feasible = _feasible(kind, fname, phi, lw, lo, hi, edge, guard_phi, guard_lw, u)
        ok = feasible & jnp.isfinite(val)
        return jnp.where(ok, val, jnp.inf)

    f0 = safe_f(u0)
    init = (u0, f0, jnp.int32(0), ~jnp.isfinite(f0), jnp.array(False))

    def cond(state):
        _, _, it, done, _ = state
        return (~done) & (it < max_iter)

    def body(state):
        u, f, it, _, _ = state
        g, hm = _derivatives(kind, fname, phi, lw, mu, a_exp, u)
        g = jnp.where(active, g, 0.0)
        hm = 0.5 * (hm + hm.T) * jnp.outer(active, active) + jnp.diag(jnp.where(active, 0.0, 1.0))
        ev, vecs = jnp.linalg.eigh(hm)
        top = jnp.max(jnp.abs(ev))
        ev = jnp.maximum(ev, 1e-12 * top + 1e-300)  # damped: positive definite, no ascent direction
        d = jnp.where(active, -(vecs @ ((vecs.T @ g) / ev)), 0.0)
        dec = -(g @ d)  # Newton decrement squared; F(u) - F* ~ dec / 2 near the optimum
        thresh = tol * jnp.abs(f) + 1e-15
        small = 0.5 * dec <= thresh

        def ls_cond(c):
            t, ft, k = c
            return (~(ft <= f - 1e-4 * t * dec)) & (k < 60)

        def ls_body(c):
            t, _, k = c
            t = 0.5 * t
            return t, safe_f(u + t * d), k + 1

        t, ft, _ = lax.while_loop(ls_cond, ls_body, (1.0, safe_f(u + d), 0))
        better = ft < f
        u_new = jnp.where(better, u + t * d, u)
        f_new = jnp.where(better, ft, f)
        stalled_ok = (~better) & (0.5 * dec <= 1e3 * thresh)
        return u_new, f_new, it + 1, small | ~better, small | stalled_ok

    u, f, it, _, conv = lax.while_loop(cond, body, init)
    return u, f, conv, it


@functools.partial(jax.jit, static_argnames=("kind", "fname"))
def _solve_lanes(
    kind, fname, max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
):
    """Vmapped Newton over lanes (one problem and one start each): [L, ...] -> u [L, m], F, conv, it."""
    lane = functools.partial(_newton_lane, kind, fname)
    axes = (None, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, None, 0)
    return jax.vmap(lane, in_axes=axes)(
        max_iter, phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw, active, tol, u0
    )


def _pack(problems: list[_Problem], grids: list[_Grid], starts: list[np.ndarray]):
    """Lanes = (problem, start) pairs, node counts padded to a power of two and lanes likewise."""
    n_max = max(g.lwq.size for g in grids)
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(n_max)))
    m_real = problems[0].starts.shape[1]
    # One compilation serves every class with up to _M_PAD parameters, then one per power of two.
    m = max(_M_PAD, 2 ** math.ceil(math.log2(m_real)))
    starts = [np.pad(st, ((0, 0), (0, m - m_real))) for st in starts]
    owner = np.concatenate([np.full(st.shape[0], i) for i, st in enumerate(starts)])
    n_lanes = 2 ** math.ceil(math.log2(owner.size))
    owner = np.concatenate([owner, np.full(n_lanes - owner.size, owner[-1])])
    u0 = np.concatenate(starts + [np.repeat(starts[-1][-1:], n_lanes - sum(map(len, starts)), 0)])
    b = len(problems)
    phi = np.zeros((b, n_pad, m))
    lw = np.full((b, n_pad), -np.inf)
    mu = np.zeros((b, m))
    edge = np.zeros((b, n_pad), dtype=bool)
    for i, (p, g) in enumerate(zip(problems, grids, strict=True)):
        ph, lq, mp = p.solver_data(g)
        phi[i, : lq.size, :m_real] = ph
        lw[i, : lq.size] = lq
        mu[i, :m_real] = mp
        edge[i, : lq.size] = g.edge_mask
    n_guard = max((0 if g.guard_lw is None else g.guard_lw.size) for g in grids)
    g_pad = 2 ** math.ceil(math.log2(max(n_guard, 1)))
    guard_phi = np.zeros((b, g_pad, m))
    guard_lw = np.full((b, g_pad), -np.inf)
    for i, g in enumerate(grids):
        if g.guard_lw is not None and g.guard_lw.size:
            guard_phi[i, : g.guard_lw.size, :m_real] = g.guard_phi
            guard_lw[i, : g.guard_lw.size] = g.guard_lw
    a_exp = np.array([p.A for p in problems])
    pad = (0, m - m_real)
    lo = np.stack([np.pad(p.lo, pad, constant_values=-np.inf) for p in problems])
    hi = np.stack([np.pad(p.hi, pad, constant_values=np.inf) for p in problems])
    lanes = tuple(x[owner] for x in (phi, lw, mu, a_exp, lo, hi, edge, guard_phi, guard_lw))
    return lanes, u0, owner, np.arange(m) < m_real


def _run_solver(
    problems: list[_Problem],
    grids: list[_Grid],
    starts: list[np.ndarray],
    tol: float,
    max_iter: int = _MAX_ITER,
):
    kind = problems[0].kind
    fname = problems[0].fname if kind == "fform" else None
    lanes, u0, owner, active = _pack(problems, grids, starts)
    u, f, conv, _ = _solve_lanes(
        kind,
        fname,
        jnp.int32(max_iter),
        *map(jnp.asarray, lanes),
        jnp.asarray(active),
        jnp.float64(tol),
        jnp.asarray(u0),
    )
    u, f, conv = np.asarray(u)[:, : active.sum()], np.asarray(f), np.asarray(conv)
    f = np.where(np.isfinite(f), f, np.inf)
    best_u, best_f, best_c = [], [], []
    for i in range(len(problems)):
        idx = np.nonzero(owner == i)[0]
        j = idx[int(np.argmin(f[idx]))]
        best_u.append(u[j])
        best_f.append(f[j])
        best_c.append(conv[j])
    return np.stack(best_u), np.array(best_f), np.array(best_c)


def _tight_value(prob: _Problem, f_min: float) -> float:
    """The solver's optimum on the reported scale."""
    if prob.kind.startswith("renyi"):
        r = -math.log(f_min) if f_min > 0 else math.inf
        return r if prob.fname == "renyi" else float(alpha_from_renyi(r, prob.alpha))
    return -f_min


def _solve_problems(problems: list[_Problem], tol: float) -> list[dict[str, Any]]:
    """Grid-refinement rounds around the batched Newton solver; final evaluation on a fresh grid."""
    grids = [p.geometry.initial_grid() for p in problems]
    # Round 0 only has to locate the roots of h (its grid is not split there, so Newton is erratic
    # near convergence): a loose tolerance and a short budget; later rounds polish on split grids.
    u, f, conv = _run_solver(
        problems, grids, [p.starts for p in problems], max(tol, 1e-6), _ROUND0_ITER
    )
    prev = np.array([_tight_value(p, fi) for p, fi in zip(problems, f, strict=True)])
    stable = np.zeros(len(problems), dtype=bool)
    for _ in range(_MAX_ROUNDS):
        grids = [
            p.geometry.refined_grid(p, ui, g) for p, ui, g in zip(problems, u, grids, strict=True)
        ]
        for i, p in enumerate(problems):
            if p.rebase is not None:
                u[i], grids[i] = p.rebase(u[i], grids[i])
        # Warm start from the best point only (one lane per problem: the starts have done their job).
        warm = [ui[None, :] for ui in u]
        u, f, conv = _run_solver(problems, grids, warm, tol)
        vals = np.array([_tight_value(p, fi) for p, fi in zip(problems, f, strict=True)])
        stable = np.abs(vals - prev) <= 10.0 * tol * np.abs(vals) + 1e-13
        prev = vals
        if np.all(stable | ~np.isfinite(vals)):
            break
    out = []
    for p, ui, g, ci, si in zip(problems, u, grids, conv, stable, strict=True):
        final = p.geometry.refined_grid(p, ui, g)
        out.append(_evaluate(p, ui, final, bool(ci), bool(si), tol))
    return out


def _weighted(w: np.ndarray, values: Any) -> float:
    """sum(w * values) with zero-weight nodes contributing 0 even where values overflow."""
    values = np.asarray(values)
    return float(np.sum(np.where(w > 0, w * np.where(w > 0, values, 0.0), 0.0)))


def _conjugate(div: Divergence, h: np.ndarray) -> np.ndarray:
    """``div.conjugate`` on a padded copy of h (shapes reused across calls: no eager recompiles)."""
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(max(h.size, 1))))
    padded = np.zeros(n_pad)
    padded[: h.size] = h
    return np.asarray(div.conjugate(jnp.asarray(padded)))[: h.size]


def _conjugate_derivatives(div: Divergence, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and second derivatives of ``div.conjugate`` at h (elementwise, padded)."""
    n_pad = max(_N_BUCKET, 2 ** math.ceil(math.log2(max(h.size, 1))))
    padded = jnp.asarray(np.pad(h, (0, n_pad - h.size)))
    d1 = jax.grad(div.conjugate)
    slope = jax.vmap(d1)(padded)
    bend = jax.vmap(jax.grad(d1))(padded)
    return np.asarray(slope)[: h.size], np.asarray(bend)[: h.size]


def _decrement(grad: np.ndarray, curv: np.ndarray) -> float:
    """sqrt(g^T C^-1 g): the Newton decrement, whose square / 2 estimates the remaining gap.

    Eigenvalues of C below 1e-12 of the largest are raised to that floor (a gradient along an almost
    flat direction then counts as a large possible gain, never as none).
    """
    if not (np.all(np.isfinite(grad)) and np.all(np.isfinite(curv))):
        return math.inf
    ev, vecs = np.linalg.eigh(0.5 * (curv + curv.T))
    top = float(np.max(np.abs(ev))) if ev.size else 0.0
    if top <= 0.0:
        return 0.0 if not np.any(grad) else math.inf
    proj = vecs.T @ grad
    lam2 = float(np.sum(proj**2 / np.maximum(ev, 1e-12 * top)))
    return math.sqrt(max(lam2, 0.0))


def _evaluate(
    prob: _Problem, u: np.ndarray, grid: _Grid, converged: bool, stable: bool, tol: float
) -> dict[str, Any]:
    """Plain f-form and tight form at the optimum, on the final grid, plus the quadrature checks.

    Both are computed with the rule's P and Q weights normalised to mass 1 (the rule misses ~1e-15 of
    each) and the tight form with log1p / expm1 around h = 1 (alpha family) or h = E_P h (KL), so a
    value of 1e-7 keeps ~1e-14 relative accuracy; ``value`` is the tight form (equal to the f-form at
    the optimum, and computed with less cancellation), ``f_value`` the plain f-form.
    """
    wp, wq = _exp(grid.lwp), _exp(grid.lwq)
    wp, wq = wp / wp.sum(), wq / wq.sum()
    reason = None
    if prob.kind.startswith("renyi"):
        div = get_divergence("alpha", alpha=prob.alpha, convention=prob.convention)
        mu = wp @ grid.phi
        hm1 = (grid.phi - mu) @ u  # h - 1, E_P[h] = 1
        h_q = 1.0 + hm1
        base = np.abs(h_q) if prob.kind == "renyi_abs" else np.maximum(h_q, 0.0)
        big_a = prob.A
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_base = np.where(hm1 > -0.5, np.log1p(np.maximum(hm1, -0.5)), np.log(base))
            terms = np.log(wq) + big_a * log_base
            excess = float(wq @ np.where(wq > 0, np.expm1(big_a * log_base), 0.0))  # F - 1
        # log F: log1p where F is near 1 (small values), logsumexp where it is far below (large ones)
        log_m = math.log1p(excess) if excess > -0.5 else quad.logsumexp(terms)
        tight_r = -log_m
        log_t = -(prob.alpha - 1.0) * log_m - math.log(
            prob.alpha - 1.0
        )  # log of the f-form's scale
        t_star = math.exp(min(log_t, 700.0))
        theta_z = t_star * np.concatenate([[1.0 - mu @ u], u])
        h_all = theta_z[0] + grid.phi @ theta_z[1:]
        with np.errstate(over="ignore", invalid="ignore"):
            f_value = float(wp @ h_all - _weighted(wq, _conjugate(div, h_all)))
        if log_t > 700.0 or not math.isfinite(f_value):
            f_value = float(alpha_from_renyi(tight_r, prob.alpha))
            reason = (
                "the plain f-form's optimal scale overflows float64: f_value from the scale-free "
                "form, theta scaled down to stay finite"
            )
        tail = float(np.sum(_exp(terms[grid.edge_mask] - log_m)))
        if prob.fname == "renyi":
            tight = value = tight_r
        else:
            tight = value = float(alpha_from_renyi(tight_r, prob.alpha))
        # V = -log F, F = E_Q[|h|^A]: grad V = -A E_Q[|h|^(A-1) sign(h) (phi - mu)] / F and
        # -hess V ~ A (A - 1) E_Q[|h|^(A-2) (phi - mu)(phi - mu)^T] / F at the optimum.
        cen = grid.phi - mu
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            rel = _exp(terms - log_m)  # w q |h|^A / F
            dterm = np.where(base > 0, rel / h_q, 0.0)
            d2term = np.where(base > 0, rel / np.maximum(h_q * h_q, 1e-200), 0.0)
        grad = -big_a * (cen.T @ dterm)
        curv = big_a * (big_a - 1.0) * (cen * d2term[:, None]).T @ cen
    elif prob.kind == "dv":
        s = grid.phi @ u
        centre = float(wp @ s)
        sc = s - centre
        live = wq > 0
        with np.errstate(over="ignore", invalid="ignore"):
            if np.max(np.abs(sc[live]), initial=0.0) <= 1.0:
                log_mc = math.log1p(float(wq[live] @ np.expm1(sc[live])))
            else:
                log_mc = quad.logsumexp(np.log(wq[live]) + sc[live])
        log_m = centre + log_mc
        b = 1.0 - log_m
        theta_z = np.concatenate([[b], u])
        h_all = b + s
        # f* = exp(s - 1) (docs/theory/divergences.md), summed as exp(log w q + h - 1): far-tail nodes have
        # w q = 0 while exp(h - 1) overflows, and 0 * inf must not turn the sum into NaN.
        with np.errstate(divide="ignore"):
            f_value = float(wp @ h_all - np.sum(_exp(np.log(wq) + h_all - 1.0)))
        tight = value = -log_mc  # E_P[s] - log E_Q[exp s], with E_P[s - centre] = 0
        with np.errstate(divide="ignore"):
            tilted = _exp(np.log(wq) + s - log_m)
        tail = float(np.sum(tilted[grid.edge_mask]))
        m1 = tilted @ grid.phi
        grad = wp @ grid.phi - m1  # E_P[phi] - E_tilted[phi]
        curv = (grid.phi * tilted[:, None]).T @ grid.phi - np.outer(m1, m1)  # Cov_tilted(phi)
    else:
        div = get_divergence(prob.fname)
        theta_z = u
        h_all = grid.phi @ u
        f_value = float(wp @ h_all - _weighted(wq, _conjugate(div, h_all)))
        tight = value = f_value
        tail = float(np.sum(wq[grid.edge_mask] * np.abs(h_all[grid.edge_mask]))) / max(
            float(wq @ np.abs(h_all)), 1e-300
        )
        slope, bend = _conjugate_derivatives(div, h_all)
        grad = wp @ grid.phi - (wq * np.where(wq > 0, slope, 0.0)) @ grid.phi
        curv = (grid.phi * (wq * np.where(wq > 0, bend, 0.0))[:, None]).T @ grid.phi
    ok = converged and stable
    sup = get_divergence(prob.fname).conjugate_sup if prob.kind == "fform" else math.inf
    if not converged and math.isfinite(sup) and np.max(h_all) > sup - 1e-3:
        reason = (
            f"the domain constraint h(x) < {sup:.6g} is active at the optimum (max h = "
            f"{np.max(h_all):.6g}): the value is a feasible lower bound on the constrained supremum"
        )
    elif not converged:
        reason = "Newton did not reach the tolerance"
    elif not stable:
        reason = "the value still moved between quadrature refinements"
    if tail > 1e-9 and math.isfinite(value):
        ok = False
        reason = (
            f"{tail:.2g} of the integrand's mass lies at the edge of the quadrature range: "
            "E_Q[f*(h)] may be infinite near the optimum (an unbounded feature map?)"
        )
    if not math.isfinite(value) and reason is None:
        reason = "non-finite value at the optimum"
    grad_norm = float(np.linalg.norm(grad))
    decrement = _decrement(grad, curv)
    if not math.isfinite(grad_norm):
        grad_norm = math.inf
    if ok and decrement**2 / 2.0 > GAP_TOL * (1.0 + abs(value)):
        ok = False
        reason = (
            f"not certified: the Newton decrement {decrement:.3g} at the returned point leaves a "
            f"possible gap of ~{decrement**2 / 2:.3g} (tolerance {GAP_TOL:g} x (1 + |value|))"
        )
    return {
        "value": value,
        "f_value": f_value,
        "tight_value": tight,
        "theta": prob.to_theta(np.asarray(theta_z, dtype=np.float64)),
        "converged": ok,
        "reason": reason,
        "u": np.asarray(u, dtype=np.float64),
        "gradient_norm": grad_norm,
        "newton_decrement": decrement,
        "problem": prob,
        "grid": grid,
        "h": h_all,  # the plain f-form's optimal h on the grid's nodes
    }


# --------------------------------------------------------------------------------------------------
# Building problems from the public inputs
# --------------------------------------------------------------------------------------------------


class _Adversary(NamedTuple):
    kind: str  # 'linear' | 'poly' | 'feature_map'
    degree: int | None
    fn: Callable | None


def _parse_divergence(divergence: Any, alpha: Any, convention: str) -> tuple[str, str]:
    if isinstance(divergence, Divergence):
        name = divergence.name
        convention = divergence.convention
    else:
        name = check_choice("divergence", divergence, DIVERGENCE_NAMES)
    check_choice("convention", convention, ("abs", "nonneg"))
    if name not in ("renyi", "alpha") and alpha is not None:
        _fail(
            "alpha",
            alpha,
            "must be None for divergence " + repr(name),
            "only 'renyi' and 'alpha' use it",
        )
    return name, convention


def _parse_adversary(adversary: Any, degree: Any) -> _Adversary:
    if callable(adversary) and not isinstance(adversary, str):
        return _Adversary("feature_map", None, adversary)
    check_choice(
        "adversary", adversary, ADVERSARIES + ("<a callable feature map x [n] -> [n, m]>",)
    )
    k = check_int_at_least("degree", degree, 1)
    if adversary == "linear" and k != 1:
        _fail("degree", degree, "must be 1 for adversary 'linear'", "use adversary='poly'")
    return _Adversary(adversary, k, None)


def _call_features(fn: Callable, x: np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(fn(x), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a bad input
        raise InvalidParameterError(
            f"adversary={fn!r} is invalid: calling it on an array of shape {x.shape} failed: {exc}"
        ) from exc
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != x.shape[0] or arr.shape[1] < 1:
        _fail(
            "adversary",
            fn,
            f"must map x [n] to features [n, m]; got shape {arr.shape} for n={x.shape[0]}",
        )
    return arr


def _check_feature_map(fn: Callable, scale: float) -> int:
    probe = _call_features(fn, np.linspace(-2.0, 2.0, 7) * max(scale, 1.0))
    if not np.all(np.isfinite(probe)):
        _fail("adversary", fn, "the feature map must return finite values")
    return probe.shape[1]


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


def _check_tol(tol: Any) -> float:
    return check_in_range("tol", tol, 0.0, 1e-3, low_open=True)


def _feasible_start(u: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    u = u.copy()
    for j in range(u.size):
        a, b = lo[j], hi[j]
        if np.isfinite(a) and np.isfinite(b):
            u[j] = np.clip(u[j], a + 0.1 * (b - a), b - 0.1 * (b - a))
        elif np.isfinite(b):
            u[j] = min(u[j], b - 0.05)
        elif np.isfinite(a):
            u[j] = max(u[j], a + 0.05)
    return u


def _starts(base: np.ndarray, scales: np.ndarray, lo, hi, n_starts: int) -> np.ndarray:
    rng = np.random.default_rng(20190)
    out = [_feasible_start(base, lo, hi)]
    for _ in range(n_starts - 1):
        out.append(_feasible_start(base + 0.3 * rng.standard_normal(base.size) / scales, lo, hi))
    return np.stack(out)


def _poly_half_width(tails: str, degree: int) -> float:
    """Half-width (standardised units) of the uniformly resolved region for polynomials of ``degree``.

    An orthonormal polynomial of degree n under exp(-|z|) oscillates out to about (pi / 2) n, under
    exp(-z^2 / 2) out to about 2 sqrt(n) (Mhaskar-Rakhmanov-Saff numbers); the integrands the solver
    forms have degree up to 2k, so the resolved region covers those reaches for n = 2k, plus the
    12 units every rule here starts with (docs/theory/exact_solver.md, section 2).
    """
    reach = math.pi * degree if tails == "laplace" else 2.0 * math.sqrt(2.0 * degree)
    return 12.0 + reach


@functools.lru_cache(maxsize=64)
def _reference_rule(law: _Law1D, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and normalised weights of (P + Q) / 2 (standardised units)."""
    z, w = quad.rule_1d(
        law.grid_centres,
        law.kinks,
        extent=_EXTENT,
        width=0.5,
        half_width=_poly_half_width(law.tails, degree),
    )
    w = w * 0.5 * (_exp(law.log_p(z)) + _exp(law.log_q(z)))
    return z, w / w.sum()


@functools.lru_cache(maxsize=64)
def _poly_basis(law: _Law1D, degree: int) -> orthopoly.OrthoPoly:
    """psi_0..psi_degree orthonormal under (P + Q) / 2 (standardised units)."""
    z, w = _reference_rule(law, degree)
    return orthopoly.stieltjes(z, w, degree, shift=float(w @ z))


def _kind(name: str, convention: str) -> str:
    if name in ("renyi", "alpha"):
        return "renyi_abs" if convention == "abs" else "renyi_nonneg"
    return "dv" if name == "kl" else "fform"


def _bounded_starts(starts: np.ndarray, feats: Callable, name: str, delta: float) -> np.ndarray:
    """Bounded conjugate domain: shrinks each start until h < sup / 2 on a probe grid (h = 0 at 0)."""
    sup = get_divergence(name).conjugate_sup
    if math.isfinite(sup):
        probe = feats(np.linspace(-50.0, 50.0 + delta, 2001))
        for i in range(starts.shape[0]):
            top = float(np.max(probe @ starts[i]))
            if top > 0.5 * sup:
                starts[i] *= 0.5 * sup / top
    return starts


def _problem_1d(
    law: _Law1D,
    scale: float,
    name: str,
    adv: _Adversary,
    alpha: float | None,
    convention: str,
    n_starts: int,
    basis: orthopoly.OrthoPoly | None = None,
    warm: np.ndarray | None = None,
) -> _Problem:
    """One 1-D problem in standardised units z = x / scale (delta = shift / scale).

    Linear and polynomial classes go to :func:`_problem_poly`; a feature map is parametrised by its
    columns, each scaled to unit root mean square on a probe grid.
    """
    kind = _kind(name, convention)
    if adv.kind != "feature_map":
        return _problem_poly(law, scale, name, adv.degree, alpha, convention, n_starts, basis, warm)
    fn = adv.fn

    def feats(z: np.ndarray) -> np.ndarray:
        f = _call_features(fn, scale * np.asarray(z, dtype=np.float64))
        if kind == "fform":
            f = np.concatenate([np.ones((f.shape[0], 1)), f], axis=1)
        return f

    probe = feats(np.linspace(-4.0, 4.0 + law.delta, 41))
    col_scale = np.maximum(np.sqrt(np.mean(probe**2, axis=0)), 1e-3)
    m = probe.shape[1]
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    starts = _starts(np.zeros(m), col_scale, lo, hi, n_starts)
    if kind == "fform":
        starts = _bounded_starts(starts, feats, name, law.delta)
    a_exp = alpha / (alpha - 1.0) if alpha is not None else 0.0
    extent = _KL_EXTENT if kind == "dv" else _EXTENT
    geom = _Geometry1D(law, feats, extent)
    return _Problem(kind, name, alpha, a_exp, convention, geom, lo, hi, starts, lambda t: t.copy())


class _BasisRef:
    """The current orthonormal basis of one polynomial problem (it changes between rounds)."""

    def __init__(self, poly: orthopoly.OrthoPoly, degree: int, with_constant: bool):
        self.poly = poly
        self.degree = degree
        self.with_constant = with_constant

    def features(self, z: np.ndarray) -> np.ndarray:
        vals = self.poly(z, self.degree)
        return vals if self.with_constant else vals[:, 1:]


def _dv_bounds(law: _Law1D, poly: orthopoly.OrthoPoly, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The domain of E_Q[exp h] for h = sum_j u_j psi_j of degree k, in the coordinates u.

    psi_k has a positive leading coefficient lc_k, so the coefficient of z^k in h is u_k lc_k: it must
    be negative for an even k >= 2 (< 1/2 for the Gaussian at k = 2), and below 1 in absolute value
    for the Laplace linear class (docs/theory/exact_solver.md, section 3).
    """
    lo, hi = np.full(k, -np.inf), np.full(k, np.inf)
    lc = poly.leading_coefficients()[k]
    if k == 1 and law.tails == "laplace":
        lo[0], hi[0] = (-1.0 + _LIN_KL_MARGIN) / lc, (1.0 - _LIN_KL_MARGIN) / lc
    elif k == 2 and law.tails == "gaussian":
        hi[-1] = 0.5 / lc
    elif k >= 2:
        hi[-1] = 0.0
    return lo, hi


def _problem_poly(
    law: _Law1D,
    scale: float,
    name: str,
    degree: int,
    alpha: float | None,
    convention: str,
    n_starts: int,
    basis: orthopoly.OrthoPoly | None,
    warm: np.ndarray | None,
) -> _Problem:
    """A polynomial class of ``degree`` (1 = linear), parametrised by orthonormal polynomials.

    The basis starts orthonormal under (P + Q) / 2 (or is ``basis``, e.g. adapted to a lower degree's
    optimum) and, for the alpha family, is rebuilt between rounds orthonormal under the weight of the
    objective's Hessian at the current point (:func:`_rebase_renyi`), so Newton's linear algebra stays
    well conditioned at any degree float64 can represent (docs/theory/exact_solver.md, section 2).
    """
    kind = _kind(name, convention)
    k = degree
    dropped = kind == "dv" and k >= 3 and k % 2 == 1
    if dropped:
        k -= 1  # an odd leading coefficient makes E_Q[exp h] infinite: it must be 0
    ref = _BasisRef(_poly_basis(law, k) if basis is None else basis, k, False)
    ref.with_constant = kind == "fform"
    m = k + (1 if kind == "fform" else 0)
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    base = np.zeros(m)
    if kind == "dv":
        lo, hi = _dv_bounds(law, ref.poly, k)
        if k >= 2:
            base[-1] = -0.05
    starts = _starts(base, np.ones(m), lo, hi, n_starts)
    if warm is not None:
        # A lower degree's optimum, embedded (``[w, m]``; replaces the last w random starts).
        w = min(warm.shape[0], starts.shape[0] - 1)
        starts[starts.shape[0] - w :] = warm[:w]
    if kind == "fform":
        starts = _bounded_starts(starts, ref.features, name, law.delta)
    powers = np.arange(1, k + 1, dtype=np.float64)

    def to_theta(theta_z: np.ndarray) -> np.ndarray:
        # (constant, u_1..u_k) on psi_0..psi_k -> monomial coefficients in z -> in x = scale z.
        theta = ref.poly.monomial_matrix()[: k + 1, : k + 1] @ theta_z
        theta[1:] = theta[1:] / scale**powers
        return np.concatenate([theta, [0.0]]) if dropped else theta

    a_exp = alpha / (alpha - 1.0) if alpha is not None else 0.0
    # The long reach is for E_Q[exp(a z)] under Laplace noise with |a| near 1 (linear class only); an
    # even-degree h with a negative leading coefficient decays like a Gaussian or faster.
    extent = _KL_EXTENT if kind == "dv" and k == 1 else _EXTENT
    half_width = _poly_half_width(law.tails, k)
    geom = _Geometry1D(law, ref.features, extent, half_width, kind == "dv" and k >= 2)
    prob = _Problem(kind, name, alpha, a_exp, convention, geom, lo, hi, starts, to_theta)
    if kind.startswith("renyi"):
        prob.rebase = functools.partial(_rebase_renyi, prob, ref)
    prob.basis_ref = ref
    return prob


def _rebase_renyi(
    prob: _Problem, ref: _BasisRef, u: np.ndarray, grid: _Grid
) -> tuple[np.ndarray, _Grid]:
    """Re-expresses h in polynomials orthonormal under the Hessian weight q |h|^(A - 2) at u.

    The Hessian of E_Q[|h|^A] is A (A - 1) E_Q[|h|^(A-2) (psi - mu)(psi - mu)^T]; in a basis orthonormal
    under (a regularised) q |h|^(A-2) it is close to a multiple of the identity, whatever the noise
    geometry and the order. The class is unchanged (same span); u is mapped exactly by the discrete
    inner products T = <psi_new, psi_old> under that weight. The new basis is kept only if it
    reproduces h on the nodes and does not worsen the objective.
    """
    k = ref.degree
    old = ref.poly(grid.z, k)
    wq = _exp(grid.lwq)
    mu = _exp(grid.lwp) @ old[:, 1:]
    h = 1.0 + (old[:, 1:] - mu) @ u
    floor = 1e-6 * math.sqrt(max(float(wq @ (h * h)), 1e-300))
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        lw = grid.lwq + (prob.A - 2.0) * np.log(np.maximum(np.abs(h), floor))
    lw = np.where(np.isfinite(lw), lw, -np.inf)
    weight = _exp(lw - np.max(lw))
    weight = weight / weight.sum()
    ref_w = 0.5 * (wq + _exp(grid.lwp))
    weight = weight + 1e-8 * ref_w / ref_w.sum()  # keeps every degree supported
    weight = weight / weight.sum()
    centre = float(weight @ grid.z)
    width = math.sqrt(max(float(weight @ (grid.z - centre) ** 2), 1e-12))
    try:
        poly = orthopoly.stieltjes(grid.z, weight, k, shift=centre, width=width)
    except ValueError:
        return u, grid
    new = poly(grid.z, k)
    if not np.all(np.isfinite(new)):
        return u, grid
    t = new.T @ (weight[:, None] * old)
    u_new = t[1:, 1:] @ u
    mu_new = _exp(grid.lwp) @ new[:, 1:]
    h_new = 1.0 + (new[:, 1:] - mu_new) @ u_new
    f_old = float(wq @ np.abs(h) ** prob.A)
    f_new = float(wq @ np.abs(h_new) ** prob.A)
    if not (math.isfinite(f_new) and f_new <= f_old * (1.0 + 1e-12)):
        return u, grid
    ref.poly = poly
    return u_new, grid.with_features(ref.features)


def _problem_2d_laplace(
    deltas: tuple[float, float], scale: float, name: str, alpha: float, convention: str
) -> _Problem:
    kind = "renyi_abs" if convention == "abs" else "renyi_nonneg"

    def to_theta(theta_z: np.ndarray) -> np.ndarray:
        return np.concatenate([[theta_z[0]], theta_z[1:] / scale])

    inf2 = np.full(2, np.inf)
    return _Problem(
        kind,
        name,
        alpha,
        alpha / (alpha - 1.0),
        convention,
        _Geometry2D(deltas),
        -inf2,
        inf2,
        np.zeros((1, 2)),
        to_theta,
    )


def _result(
    pair: NoisePair,
    name: str,
    adv: _Adversary,
    alpha: float | None,
    convention: str,
    *,
    f_value: float,
    theta: np.ndarray,
    converged: bool,
    reason: str | None,
    value: float | None = None,
    tight_value: float | None = None,
    gradient_norm: float | None = None,
    newton_decrement: float | None = None,
    monotone_checked: bool = False,
    previous_value: float | None = None,
) -> ExactResult:
    if value is None:
        value = float(renyi_from_alpha(f_value, alpha)) if name == "renyi" else float(f_value)
    return ExactResult(
        float(value),
        float(f_value),
        np.asarray(theta, dtype=np.float64),
        bool(converged),
        reason,
        float(value if tight_value is None else tight_value),
        pair,
        name,
        adv.kind,
        adv.degree,
        alpha,
        convention,
        None if gradient_norm is None else float(gradient_norm),
        None if newton_decrement is None else float(newton_decrement),
        bool(monotone_checked),
        None if previous_value is None else float(previous_value),
    )


def _n_params(pair: NoisePair, adv: _Adversary) -> int:
    if adv.kind == "linear":
        return pair.dim
    if adv.kind == "poly":
        return adv.degree
    return _check_feature_map(adv.fn, pair.scale or 1.0)


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


def _restricted_many(
    pair: Any,
    divergence: Any,
    adversary: Any,
    degree: Any,
    alphas: list[Any],
    convention: str,
    n_starts: Any,
    tol: Any,
) -> list[ExactResult]:
    pair = output_laws(pair)
    name, convention = _parse_divergence(divergence, None, convention)
    if name in ("renyi", "alpha"):
        alphas = [check_alpha(a) for a in alphas]
    elif any(a is not None for a in alphas):
        _fail(
            "alpha",
            alphas[0],
            f"must be None for divergence {name!r}",
            "only 'renyi' and 'alpha' use it",
        )
    adv = _parse_adversary(adversary, degree)
    if adv.kind == "poly":
        _check_degree(pair, name, adv.degree)
    n_starts = check_int_at_least("n_starts", n_starts, 1)
    tol = _check_tol(tol)
    if adv.kind != "linear" and pair.dim != 1:
        _fail(
            "adversary",
            adversary,
            f"must be 'linear' for a {pair.dim}-dimensional pair",
            "polynomial and feature-map classes are supported in 1-D only",
        )
    m = _n_params(pair, adv)

    structural = _structural(pair, name, adv)
    if structural is not None:
        f_value, reason, theta = structural
        before = 0.0 if (adv.degree or 1) == 1 or f_value == 0.0 else f_value
        if name == "renyi" and before:
            before = float(renyi_from_alpha(before, alphas[0]))
        if theta is None:
            theta = np.zeros(m + 1) if math.isfinite(f_value) else np.zeros(0)
        return [
            _result(
                pair,
                name,
                adv,
                a,
                convention,
                f_value=f_value,
                theta=theta,
                converged=True,
                reason=reason,
                gradient_norm=0.0,
                newton_decrement=0.0,
                # The value is the same at every degree (and >= 0, the constants' value).
                monotone_checked=adv.kind != "feature_map",
                previous_value=None if adv.kind == "feature_map" else before,
            )
            for a in alphas
        ]

    v = np.asarray(pair.shift)
    nz = np.nonzero(v)[0]
    scale = pair.scale
    d = pair.dim

    if d == 1 or adv.kind != "linear":
        sols = _solve_1d(
            pair.law(v[0] / scale), scale, name, adv, alphas, convention, n_starts, tol
        )
        return [
            _from_solution(pair, name, adv, a, convention, s)
            for a, s in zip(alphas, sols, strict=True)
        ]

    if name in ("kl", "chi2") and pair.family != "subsampled_gaussian":
        # Both decompose over independent coordinates (the class has one shared constant).
        probs = [
            _problem_1d(pair.law(v[i] / scale), scale, name, adv, None, convention, n_starts)
            for i in nz
        ]
        sols = _solve_problems(probs, tol)
        theta = np.zeros(d + 1)
        for i, s in zip(nz, sols, strict=True):
            theta[0] += s["theta"][0]
            theta[1 + i] = s["theta"][1]
        if name == "kl":
            theta[0] -= len(nz) - 1  # b = 1 - sum_i log M_i, while each b_i = 1 - log M_i
        total = {
            "value": math.fsum(s["value"] for s in sols),
            "f_value": math.fsum(s["f_value"] for s in sols),
            "tight_value": math.fsum(s["tight_value"] for s in sols),
            "theta": theta,
            "converged": all(s["converged"] for s in sols),
            "reason": next((s["reason"] for s in sols if s["reason"]), None),
        }
        return [_from_solution(pair, name, adv, None, convention, total)]

    # Renyi / alpha, linear class, d > 1 (every divergence for the subsampled Gaussian: the mixture
    # does not factorise, but both laws are invariant under rotations fixing v, so the best linear h
    # is along v; docs/theory/subsampled_gaussian.md).
    if pair.family in ("gaussian", "subsampled_gaussian"):
        norm = float(np.linalg.norm(v))
        probs = [
            _problem_1d(pair.law(norm / scale), scale, name, adv, a, convention, n_starts)
            for a in alphas
        ]
        sols = _solve_problems(probs, tol)
        for s in sols:
            th = s["theta"]
            s["theta"] = np.concatenate([[th[0]], th[1] * v / norm])
        return [
            _from_solution(pair, name, adv, a, convention, s)
            for a, s in zip(alphas, sols, strict=True)
        ]
    if nz.size == 1:
        i = int(nz[0])
        probs = [
            _problem_1d(pair.law(v[i] / scale), scale, name, adv, a, convention, n_starts)
            for a in alphas
        ]
        sols = _solve_problems(probs, tol)
        for s in sols:
            th = np.zeros(d + 1)
            th[0], th[1 + i] = s["theta"][0], s["theta"][1]
            s["theta"] = th
        return [
            _from_solution(pair, name, adv, a, convention, s)
            for a, s in zip(alphas, sols, strict=True)
        ]
    if nz.size > 2:
        _fail(
            "pair",
            pair.label,
            "restricted Renyi / alpha for the Laplace linear class is supported for at most 2 "
            "coordinates with a non-zero shift (it does not decompose over coordinates; nested "
            "quadrature is used for 2)",
        )
    i, j = int(nz[0]), int(nz[1])
    probs = [
        _problem_2d_laplace((v[i] / scale, v[j] / scale), scale, name, a, convention)
        for a in alphas
    ]
    sols = _solve_problems(probs, tol)
    for s in sols:
        th = np.zeros(d + 1)
        th[0], th[1 + i], th[1 + j] = s["theta"][0], s["theta"][1], s["theta"][2]
        s["theta"] = th
    return [
        _from_solution(pair, name, adv, a, convention, s) for a, s in zip(alphas, sols, strict=True)
    ]


def _degree_chain(kind: str, degree: int) -> list[int]:
    """The degrees solved, in order, for a polynomial class of ``degree``; the last is the answer.

    KL (``'dv'``) climbs 1, 2, 4, ..., k_eff by continuation (k_eff = k, or k - 1 for odd k >= 3,
    whose leading coefficient must be 0): each optimum, with a small negative top coefficient added,
    starts the next degree inside the domain of E_Q[exp h]. The other forms have no domain to stay in
    and solve k - 1 then k. Either way the last two entries give the monotonicity certificate.
    """
    if kind == "dv":
        k_eff = degree - 1 if degree >= 3 and degree % 2 == 1 else degree
        return [1, *range(2, k_eff + 1, 2)]
    return [degree - 1, degree] if degree >= 2 else [1]


def _degrees_chain(kind: str, max_degree: int) -> list[int]:
    """Every degree 1..max_degree, except that KL skips odd k >= 3 (poly_k = poly_(k-1) there)."""
    if kind == "dv":
        return [k for k in range(1, max_degree + 1) if k <= 2 or k % 2 == 0]
    return list(range(1, max_degree + 1))


def _transfer(law: _Law1D, sol: dict[str, Any], kind: str, degree: int, size: int) -> np.ndarray:
    """A lower degree's optimum as starting points of ``degree`` in the basis (P + Q) / 2 builds.

    The lower-degree h lies in the larger class, so its coefficients in the new orthonormal basis are
    its inner products with the new polynomials under (P + Q) / 2 (exact up to rounding). Returns
    ``[3, size]`` starts; for KL the new top coefficient must be negative, so three sizes of it are
    tried (the line search discards a start outside the numerical domain).
    """
    z, w = _reference_rule(law, degree)
    ref = sol["problem"].basis_ref
    old = ref.poly(z, ref.degree)
    u = sol["u"]
    if kind.startswith("renyi"):
        h = (old[:, 1:] - w @ old[:, 1:]) @ u  # h - 1, up to a constant
    elif kind == "dv":
        h = old[:, 1:] @ u
    else:
        h = old @ u
    new = _poly_basis(law, degree)(z, degree)
    coef = new.T @ (w * h)
    out = np.zeros((3, size))
    start = coef if kind == "fform" else coef[1:]
    out[:, : start.size] = start[:size]
    if kind == "dv" and ref.degree < degree:
        out[:, -1] = (-1e-3, -1e-6, -1e-9)
    return out


def _solve_1d(
    law: _Law1D,
    scale: float,
    name: str,
    adv: _Adversary,
    alphas: list[float | None],
    convention: str,
    n_starts: int,
    tol: float,
) -> list[dict[str, Any]]:
    """1-D problems (one per order); polynomial classes carry the degree certificate.

    A linear or polynomial class of degree k is solved along :func:`_degree_chain` (k - 1 then k; for
    KL 1, 2, 4, ..., k) by :func:`_solve_chain`, and the last entry is returned.
    """
    if adv.kind == "feature_map":
        probs = [_problem_1d(law, scale, name, adv, a, convention, n_starts) for a in alphas]
        sols = _solve_problems(probs, tol)
        for s in sols:
            s.update(monotone_checked=False, previous_value=None)
        return sols
    chain = _degree_chain(_kind(name, convention), adv.degree)
    chain[-1] = adv.degree  # KL with an odd k: the last step is poly_k itself (top coefficient 0)
    return _solve_chain(law, scale, name, chain, alphas, convention, n_starts, tol)[-1]


def _solve_chain(
    law: _Law1D,
    scale: float,
    name: str,
    chain: list[int],
    alphas: list[float | None],
    convention: str,
    n_starts: int,
    tol: float,
) -> list[list[dict[str, Any]]]:
    """Polynomial classes of the increasing degrees ``chain``, each warm started from the previous.

    Every entry is certified monotone against the one before it: value(k) >= value(previous) -
    tolerance (the classes nest, so a smaller value would prove the solve wrong); the first entry is
    compared with the constants (value 0) if it is degree 1, else with nothing it knows.
    """
    kind = _kind(name, convention)
    out: list[list[dict[str, Any]]] = []
    prev: list[dict[str, Any]] | None = None
    for e in chain:
        k = e - 1 if kind == "dv" and e >= 3 and e % 2 else e
        probs = []
        for i, a in enumerate(alphas):
            warm = None
            if prev is not None:
                warm = _transfer(law, prev[i], kind, k, k + (kind == "fform"))
            starts = max(n_starts, 4) if warm is not None else n_starts
            step = _Adversary("linear" if e == 1 else "poly", e, None)
            probs.append(_problem_1d(law, scale, name, step, a, convention, starts, None, warm))
        sols = _solve_problems(probs, tol)
        for i, s in enumerate(sols):
            if prev is not None:
                _certify_monotone(s, prev[i]["value"])
            elif e == 1:
                _certify_monotone(s, 0.0)
            else:
                s.update(monotone_checked=False, previous_value=None)
        out.append(sols)
        prev = sols
    return out


def _certify_monotone(sol: dict[str, Any], before: float) -> None:
    """Marks ``sol`` with the monotonicity certificate against the next smaller class's value."""
    slack = _MONOTONE_TOL * (1.0 + abs(before))
    sol["previous_value"] = before
    sol["monotone_checked"] = bool(sol["value"] >= before - slack)
    if not sol["monotone_checked"]:
        sol["converged"] = False
        sol["reason"] = (
            f"not certified: the value {sol['value']:.10g} lies below the previous degree's "
            f"{before:.10g} although the classes nest (the solve at this degree failed)"
        )


def _from_solution(pair, name, adv, alpha, convention, s: dict[str, Any]) -> ExactResult:
    return _result(
        pair,
        name,
        adv,
        alpha,
        convention,
        f_value=s["f_value"],
        theta=s["theta"],
        converged=s["converged"],
        reason=s["reason"],
        value=s["value"],
        tight_value=s["tight_value"],
        gradient_norm=s.get("gradient_norm"),
        newton_decrement=s.get("newton_decrement"),
        monotone_checked=s.get("monotone_checked", False),
        previous_value=s.get("previous_value"),
    )


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


@_x64
def restricted_divergence(
    pair: NoisePair | Any,
    divergence: str | Divergence,
    adversary: str | Callable[[np.ndarray], np.ndarray] = "linear",
    *,
    degree: int = 1,
    alpha: float | None = None,
    convention: str = "abs",
    n_starts: int = 4,
    tol: float = 1e-10,
    strict: bool = True,
) -> ExactResult:
    """The exact H-restricted divergence D^H(P, Q) for a class linear in its parameters.

    H is {b + theta . phi(x)}: ``'linear'`` (phi(x) = x, any dimension), ``'poly'`` (phi(x) = (x, x^2,
    ..., x^degree), 1-D) or a callable feature map ``x [n] -> [n, m]`` (1-D; e.g. random Fourier
    features; a constant is always added). The supremum of the concave objective is found by a
    damped Newton method on deterministic quadrature (module docstring), from ``n_starts`` points.

    Args:
      pair: A :class:`NoisePair` (or a Laplace / Gaussian / non-private mechanism object).
      divergence: ``'kl'``, ``'renyi'``, ``'alpha'``, ``'chi2'``, ``'tv'``, ``'hellinger'``, ``'js'``,
        or a :class:`~cbdp_jax.divergences.Divergence` (its name and convention are used).
      adversary: ``'linear'``, ``'poly'`` or a feature-map callable.
      degree: The polynomial degree for ``'poly'`` (an integer >= 1; must be 1 for ``'linear'``).
      alpha: The order for ``'renyi'`` / ``'alpha'`` (> 1); must be None otherwise.
      convention: ``'abs'`` (the paper's, f extended by |t|) or ``'nonneg'`` (f on t >= 0) for the
        alpha family. ``'nonneg'`` has the smaller conjugate, so its restricted value is >= ``'abs'``.
      n_starts: Number of starting points (an integer >= 1); the best optimum is kept.
      tol: Relative tolerance of the solver, in (0, 1e-3].
      strict: For a 1-D linear or polynomial class, raise instead of returning a value that fails its
        certificate (Newton decrement, monotonicity in the degree, quadrature checks). With
        ``strict=False`` such a value comes back with ``converged=False`` and the reason; it is then
        not a certified lower bound.

    Returns:
      An :class:`ExactResult`. Separable pairs (distinct point masses, paper Lemma 2) give ``+inf``
      with a reason; total variation, Hellinger and Jensen-Shannon with polynomial classes give 0 with
      a reason (degenerate, docs/theory/mechanisms.md).

    Raises:
      InvalidParameterError: For an unknown divergence / adversary / convention, degree < 1 or above
        :func:`degree_limit` for the pair's family and the divergence, alpha <= 1 (or alpha given for
        a divergence without one), a non-linear class on a d > 1 pair, a Laplace d > 1 Renyi problem
        with more than two shifted coordinates, a feature map that does not return finite
        ``[n, m]`` features, or (``strict``) a 1-D linear / polynomial value that cannot be certified
        (the message names ``degree``, the reason and the way out).

    Examples:
      >>> r = restricted_divergence(laplace_pair(1.0), "renyi", alpha=2.0)
      >>> round(r.value, 6)  # = log(1.5) (docs/theory/mechanisms.md)
      0.405465

    References:
      Paper eq. (1)-(3), Lemma 1, Lemma 2, Figures 1-2; docs/theory/divergences.md, objectives.md and mechanisms.md.

    """
    res = _restricted_many(pair, divergence, adversary, degree, [alpha], convention, n_starts, tol)
    if strict:
        _refuse_uncertified(res)
    return res[0]


def _refuse_uncertified(results: Sequence[ExactResult]) -> None:
    """Raises for the first 1-D linear / polynomial result that failed its certificate."""
    for r in results:
        if r.converged or r.adversary not in ("linear", "poly") or r.pair.dim != 1:
            continue
        name = "degree" if r.adversary == "poly" else "adversary"
        value = r.degree if r.adversary == "poly" else "linear"
        alpha = "" if r.alpha is None else f", alpha={r.alpha:g}"
        raise InvalidParameterError(
            f"{name}={value!r} is invalid for {r.pair.label} with divergence {r.divergence!r}{alpha}: "
            f"the exact value could not be certified ({r.reason}); use a lower degree, or "
            "strict=False for the uncertified value with converged=False"
        )


@_x64
def restricted_divergence_degrees(
    pair: NoisePair | Any,
    divergence: str | Divergence,
    max_degree: int,
    *,
    alpha: float | None = None,
    convention: str = "abs",
    n_starts: int = 4,
    tol: float = 1e-10,
) -> tuple[ExactResult, ...]:
    """The exact poly_k values for every degree k = 1..max_degree, in one pass.

    Each degree is warm started from the previous one's optimum and certified against it (the
    classes nest, so value(k) >= value(k - 1); ``monotone_checked`` and ``previous_value`` record the
    check), which costs one solve per degree instead of the two :func:`restricted_divergence` needs.
    For KL an odd degree k >= 3 has the value of k - 1 (its leading coefficient must be 0) and is not
    solved again. Results that fail their certificate come back with ``converged=False`` and a reason
    (this function never raises for that: it is the measuring tool behind the degree limits).

    Args:
      pair: A 1-D :class:`NoisePair` (or a mechanism object).
      divergence: As for :func:`restricted_divergence`.
      max_degree: The largest degree, an integer in [1, ``degree_limit(...)``].
      alpha: As for :func:`restricted_divergence`.
      convention: As for :func:`restricted_divergence`.
      n_starts: As for :func:`restricted_divergence`.
      tol: As for :func:`restricted_divergence`.

    Returns:
      One :class:`ExactResult` per degree, degree 1 first.

    Raises:
      InvalidParameterError: As for :func:`restricted_divergence`, or if ``max_degree`` is above the
        documented limit for the pair's family and the divergence, or the pair is not 1-D.

    References:
      docs/theory/exact_solver.md (sections 2-5).

    """
    pair = output_laws(pair)
    name, convention = _parse_divergence(divergence, None, convention)
    if isinstance(divergence, Divergence) and alpha is None:
        alpha = divergence.alpha
    top = _check_degree(pair, name, max_degree)
    if pair.dim != 1:
        _fail("pair", pair.label, "must be 1-dimensional for polynomial classes")
    if top == 1 or _structural(pair, name, _Adversary("poly", 2, None)) is not None:
        return tuple(
            _restricted_many(pair, divergence, "poly", k, [alpha], convention, n_starts, tol)[0]
            for k in range(1, top + 1)
        )
    kind = _kind(name, convention)
    chain = _degrees_chain(kind, top)
    if name in ("renyi", "alpha"):
        a = check_alpha(alpha)
    elif alpha is not None:
        _fail(
            "alpha",
            alpha,
            f"must be None for divergence {name!r}",
            "only 'renyi' and 'alpha' use it",
        )
    else:
        a = None
    sols = _solve_chain(
        pair.law(pair.shift[0] / pair.scale),
        pair.scale,
        name,
        chain,
        [a],
        convention,
        check_int_at_least("n_starts", n_starts, 1),
        _check_tol(tol),
    )
    by_degree = {e: s[0] for e, s in zip(chain, sols, strict=True)}
    out = []
    for k in range(1, top + 1):
        adv = _Adversary("linear" if k == 1 else "poly", k, None)
        if k in by_degree:
            out.append(_from_solution(pair, name, adv, a, convention, by_degree[k]))
            continue
        below = out[-1]  # KL, odd k: poly_k = poly_(k-1), the top coefficient is 0
        out.append(
            below._replace(
                theta=np.concatenate([below.theta, [0.0]]),
                degree=k,
                adversary="poly",
                previous_value=below.value,
                monotone_checked=below.converged,
            )
        )
    return tuple(out)


@_x64
def restricted_divergence_curve(
    pair: NoisePair | Any,
    divergence: str | Divergence,
    alphas: Sequence[float],
    adversary: str | Callable[[np.ndarray], np.ndarray] = "linear",
    *,
    degree: int = 1,
    convention: str = "abs",
    n_starts: int = 4,
    tol: float = 1e-10,
    strict: bool = True,
) -> tuple[ExactResult, ...]:
    """:func:`restricted_divergence` over a grid of orders, solved as one batch (one compilation).

    The problems for all orders are padded to a common size and solved by a single vmapped Newton
    call per refinement round, so a curve costs little more than one point.

    Args:
      pair: As for :func:`restricted_divergence`.
      divergence: ``'renyi'`` or ``'alpha'``.
      alphas: The orders, each > 1 (a non-empty sequence).
      adversary: As for :func:`restricted_divergence`.
      degree: As for :func:`restricted_divergence`.
      convention: As for :func:`restricted_divergence`.
      n_starts: As for :func:`restricted_divergence`.
      tol: As for :func:`restricted_divergence`.
      strict: As for :func:`restricted_divergence` (one uncertified order refuses the curve).

    Returns:
      One :class:`ExactResult` per order, in order.

    Raises:
      InvalidParameterError: As for :func:`restricted_divergence`, or if the divergence has no order
        or ``alphas`` is empty.

    """
    name, _ = _parse_divergence(divergence, None, convention)
    if name not in ("renyi", "alpha"):
        _fail("divergence", divergence, "must be 'renyi' or 'alpha' for a curve over alpha")
    alist = [float(a) for a in check_vector("alphas", alphas)]
    res = _restricted_many(pair, divergence, adversary, degree, alist, convention, n_starts, tol)
    if strict:
        _refuse_uncertified(res)
    return tuple(res)


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
