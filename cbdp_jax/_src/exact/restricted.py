"""The exact H-restricted divergence: one value, a curve over Renyi orders, every degree up to k."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from cbdp_jax._src.exact.degrees import _degrees_chain, _solve_1d, _solve_chain
from cbdp_jax._src.exact.float64 import _x64
from cbdp_jax._src.exact.inputs import (
    _Adversary,
    _check_tol,
    _n_params,
    _parse_adversary,
    _parse_divergence,
)
from cbdp_jax._src.exact.limits import _check_degree
from cbdp_jax._src.exact.pairs import NoisePair, output_laws
from cbdp_jax._src.exact.problems import _kind, _problem_1d, _problem_2d_laplace
from cbdp_jax._src.exact.result import ExactResult, _from_solution, _result
from cbdp_jax._src.exact.solver import _solve_problems
from cbdp_jax._src.exact.structural import _structural
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_alpha,
    check_int_at_least,
    check_vector,
)
from cbdp_jax._src.privacy.divergences import Divergence, renyi_from_alpha


class _Checked(NamedTuple):
    """The inputs of a restricted solve, checked and parsed."""

    pair: NoisePair
    name: str
    convention: str
    alphas: list[Any]
    adv: _Adversary
    n_starts: int
    tol: float


def _checked_alphas(name: str, alphas: list[Any]) -> list[Any]:
    """The orders checked (> 1) for the alpha family; for any other divergence they must be None."""
    if name in ("renyi", "alpha"):
        return [check_alpha(a) for a in alphas]
    if any(a is not None for a in alphas):
        _fail(
            "alpha",
            alphas[0],
            f"must be None for divergence {name!r}",
            "only 'renyi' and 'alpha' use it",
        )
    return alphas


def _check_dimension(pair: NoisePair, adversary: Any, adv: _Adversary) -> None:
    """Polynomial and feature-map classes need a 1-D pair."""
    if adv.kind != "linear" and pair.dim != 1:
        _fail(
            "adversary",
            adversary,
            f"must be 'linear' for a {pair.dim}-dimensional pair",
            "polynomial and feature-map classes are supported in 1-D only",
        )


def _structural_results(
    c: _Checked, m: int, structural: tuple[float, str, np.ndarray | None]
) -> list[ExactResult]:
    """One result per order for a value fixed without a solve (:func:`_structural`)."""
    f_value, reason, theta = structural
    before = 0.0 if (c.adv.degree or 1) == 1 or f_value == 0.0 else f_value
    if c.name == "renyi" and before:
        before = float(renyi_from_alpha(before, c.alphas[0]))
    if theta is None:
        theta = np.zeros(m + 1) if math.isfinite(f_value) else np.zeros(0)
    return [
        _result(
            c.pair,
            c.name,
            c.adv,
            a,
            c.convention,
            f_value=f_value,
            theta=theta,
            converged=True,
            reason=reason,
            gradient_norm=0.0,
            newton_decrement=0.0,
            # The value is the same at every degree (and >= 0, the constants' value).
            monotone_checked=c.adv.kind != "feature_map",
            previous_value=None if c.adv.kind == "feature_map" else before,
        )
        for a in c.alphas
    ]


def _solve_coordinates(c: _Checked) -> dict[str, Any]:
    """KL and chi^2 of a d > 1 linear class: a sum over independent coordinates (one constant)."""
    v = np.asarray(c.pair.shift)
    nz = np.nonzero(v)[0]
    scale = c.pair.scale
    probs = [
        _problem_1d(c.pair.law(v[i] / scale), scale, c.name, c.adv, None, c.convention, c.n_starts)
        for i in nz
    ]
    sols = _solve_problems(probs, c.tol)
    theta = np.zeros(c.pair.dim + 1)
    for i, s in zip(nz, sols, strict=True):
        theta[0] += s["theta"][0]
        theta[1 + i] = s["theta"][1]
    if c.name == "kl":
        theta[0] -= len(nz) - 1  # b = 1 - sum_i log M_i, while each b_i = 1 - log M_i
    return {
        "value": math.fsum(s["value"] for s in sols),
        "f_value": math.fsum(s["f_value"] for s in sols),
        "tight_value": math.fsum(s["tight_value"] for s in sols),
        "theta": theta,
        "converged": all(s["converged"] for s in sols),
        "reason": next((s["reason"] for s in sols if s["reason"]), None),
    }


def _solve_along_shift(c: _Checked) -> list[dict[str, Any]]:
    """Gaussian and subsampled Gaussian linear classes, d > 1: the best h is along v (1-D problems).

    The mixture does not factorise, but both laws are invariant under rotations fixing v
    (docs/theory/subsampled_gaussian.md).
    """
    v = np.asarray(c.pair.shift)
    scale = c.pair.scale
    norm = float(np.linalg.norm(v))
    law = c.pair.law(norm / scale)
    probs = [_problem_1d(law, scale, c.name, c.adv, a, c.convention, c.n_starts) for a in c.alphas]
    sols = _solve_problems(probs, c.tol)
    for s in sols:
        th = s["theta"]
        s["theta"] = np.concatenate([[th[0]], th[1] * v / norm])
    return sols


def _solve_one_coordinate(c: _Checked, i: int) -> list[dict[str, Any]]:
    """A Laplace linear class, d > 1, with one shifted coordinate i: the others get coefficient 0."""
    v = np.asarray(c.pair.shift)
    scale = c.pair.scale
    law = c.pair.law(v[i] / scale)
    probs = [_problem_1d(law, scale, c.name, c.adv, a, c.convention, c.n_starts) for a in c.alphas]
    sols = _solve_problems(probs, c.tol)
    for s in sols:
        th = np.zeros(c.pair.dim + 1)
        th[0], th[1 + i] = s["theta"][0], s["theta"][1]
        s["theta"] = th
    return sols


def _solve_two_coordinates(c: _Checked, i: int, j: int) -> list[dict[str, Any]]:
    """A Laplace linear class, d > 1, with two shifted coordinates: nested 2-D quadrature."""
    v = np.asarray(c.pair.shift)
    scale = c.pair.scale
    probs = [
        _problem_2d_laplace((v[i] / scale, v[j] / scale), scale, c.name, a, c.convention)
        for a in c.alphas
    ]
    sols = _solve_problems(probs, c.tol)
    for s in sols:
        th = np.zeros(c.pair.dim + 1)
        th[0], th[1 + i], th[1 + j] = s["theta"][0], s["theta"][1], s["theta"][2]
        s["theta"] = th
    return sols


def _solve_linear_renyi(c: _Checked) -> list[dict[str, Any]]:
    """Renyi / alpha with the linear class, d > 1 (every divergence for the subsampled Gaussian)."""
    if c.pair.family in ("gaussian", "subsampled_gaussian"):
        return _solve_along_shift(c)
    nz = np.nonzero(np.asarray(c.pair.shift))[0]
    if nz.size == 1:
        return _solve_one_coordinate(c, int(nz[0]))
    if nz.size > 2:
        _fail(
            "pair",
            c.pair.label,
            "restricted Renyi / alpha for the Laplace linear class is supported for at most 2 "
            "coordinates with a non-zero shift (it does not decompose over coordinates; nested "
            "quadrature is used for 2)",
        )
    return _solve_two_coordinates(c, int(nz[0]), int(nz[1]))


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
    """One result per order in ``alphas`` (a single None for divergences without one), by shape."""
    pair = output_laws(pair)
    name, convention = _parse_divergence(divergence, None, convention)
    alphas = _checked_alphas(name, alphas)
    adv = _parse_adversary(adversary, degree)
    if adv.kind == "poly":
        _check_degree(pair, name, adv.degree)
    n_starts = check_int_at_least("n_starts", n_starts, 1)
    c = _Checked(pair, name, convention, alphas, adv, n_starts, _check_tol(tol))
    _check_dimension(pair, adversary, adv)
    m = _n_params(pair, adv)
    structural = _structural(pair, name, adv)
    if structural is not None:
        return _structural_results(c, m, structural)
    if pair.dim == 1 or adv.kind != "linear":
        law = pair.law(np.asarray(pair.shift)[0] / pair.scale)
        sols = _solve_1d(law, pair.scale, name, adv, c.alphas, convention, c.n_starts, c.tol)
    elif name in ("kl", "chi2") and pair.family != "subsampled_gaussian":
        return [_from_solution(pair, name, adv, None, convention, _solve_coordinates(c))]
    else:
        sols = _solve_linear_renyi(c)
    return [
        _from_solution(pair, name, adv, a, convention, s)
        for a, s in zip(c.alphas, sols, strict=True)
    ]


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
    damped Newton method on deterministic quadrature (docs/theory/exact_solver.md), from
    ``n_starts`` points.

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
      >>> from cbdp_jax.exact import laplace_pair
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
    (a,) = _checked_alphas(name, [alpha])
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
