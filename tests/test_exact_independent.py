"""The exact solver against values computed here from scratch: scipy quadrature + scipy optimisation.

The reference maximises the variational form over the polynomial's coefficients directly, with
``scipy.integrate.quad`` for the expectations and ``scipy.optimize.minimize`` (BFGS, several starts) for
the supremum (vectorised composite Gauss-Legendre, checked against quad); it shares no code with ``cbdp_jax.exact`` (which works with orthonormal polynomials, its
own quadrature rules and a concave Newton solver). For KL the Donsker-Varadhan form
E_P h - log E_Q e^h is maximised; for Renyi of order alpha the scale-free form
A log E_P h - log E_Q |h|^A, A = alpha / (alpha - 1) (docs/theory/objectives.md), both of which equal
the restricted divergence at their supremum over a class closed under constants / scaling.

Tolerance: the optimiser stops at a gradient of 1e-9 and the quadrature is accurate to ~1e-13, so
1e-6 absolute is ample; a solver error of one unit in the sixth digit (the precision the theory notes print) fails.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from cbdp_jax import exact

EPS = 1.0
P = stats.laplace(loc=0.0, scale=1.0 / EPS)  # M(D) of the canonical Laplace pair
Q = stats.laplace(loc=1.0, scale=1.0 / EPS)  # M(D')
LO, HI, KINKS = -60.0, 61.0, [0.0, 1.0]


# Composite Gauss-Legendre nodes (numpy), split at the densities' kinks: the integrands are smooth on
# each piece, so 200 nodes per piece integrate them to ~1e-13 (checked against scipy.integrate.quad in
# the last test); vectorised, so the optimiser's thousands of evaluations take seconds.
_EDGES = (LO, -20.0, -5.0, 0.0, 1.0, 6.0, 21.0, HI)
_T, _W = np.polynomial.legendre.leggauss(200)
_X = np.concatenate(
    [(b - a) / 2 * _T + (a + b) / 2 for a, b in zip(_EDGES[:-1], _EDGES[1:], strict=True)]
)
_WX = np.concatenate([(b - a) / 2 * _W for a, b in zip(_EDGES[:-1], _EDGES[1:], strict=True)])
_PDF = {"P": P.pdf(_X), "Q": Q.pdf(_X)}


def _mean(f, law: str) -> float:
    """E f(X) under P or Q by the composite rule; ``f`` takes an array."""
    return float(np.sum(_WX * f(_X) * _PDF[law]))


def _kl_value(c: np.ndarray) -> float:
    """DV form of h(x) = sum_k c_k x^(k+1) (the constant cancels).

    From degree 4 the leading coefficient is -exp(c[-1]) < 0: with a positive one E_Q e^h is infinite
    (the reference's finite range would not see it), and degree 3 is degree 2 (tested separately).
    """
    coef = np.concatenate([[0.0], c])
    if len(c) >= 4:
        coef[-1] = -math.exp(c[-1])
    h = np.polynomial.Polynomial(coef)
    hx = h(_X)
    if np.max(hx) > 700.0:
        return -1e6
    return _mean(h, "P") - math.log(_mean(lambda x: np.exp(h(x)), "Q"))


def _renyi_value(c: np.ndarray, alpha: float) -> float:
    """Scale-free form of h(x) = 1 + sum_k c_k x^(k+1) (the scale cancels; E_P h > 0 near the start)."""
    big_a = alpha / (alpha - 1.0)
    h = np.polynomial.Polynomial(np.concatenate([[1.0], c]))
    e_p = _mean(h, "P")
    if e_p <= 0:
        return -1e6  # outside the form's domain (a finite value keeps BFGS's differences finite)
    return big_a * math.log(e_p) - math.log(_mean(lambda x: np.abs(h(x)) ** big_a, "Q"))


@functools.cache
def _kl_sup(degree: int) -> float:
    return _sup(_kl_value, degree)


def _sup(value, degree: int) -> float:
    best = -math.inf
    for start in (-0.3, 0.1, 0.4):
        x0 = np.full(degree, start) / np.arange(1, degree + 1) ** 2
        res = optimize.minimize(
            lambda c: -value(c), x0, method="BFGS", options={"gtol": 1e-9, "maxiter": 400}
        )
        best = max(best, -res.fun)
    return best


@pytest.mark.parametrize("degree", [1, 2])
def test_kl_restricted_to_polynomials_matches_a_scipy_optimisation(degree):
    want = _kl_sup(degree)
    got = exact.restricted_divergence(exact.laplace_pair(EPS), "kl", "poly", degree=degree).value
    assert got == pytest.approx(want, abs=1e-6)
    # the documented values: 0.225987 (linear), 0.261403 (poly_2)
    assert want == pytest.approx({1: 0.225987, 2: 0.261403}[degree], abs=2e-6)


def test_kl_poly3_equals_poly2_because_a_cubic_term_makes_e_q_exp_h_infinite():
    # Any nonzero cubic coefficient: e^{c x^3} grows faster than the Laplace density decays on one
    # side, so E_Q e^h = +inf and the DV value is -inf; the supremum is the quadratic one.
    for c3 in (1e-3, -1e-3):
        tail = 40.0 if c3 > 0 else -40.0
        assert c3 * tail**3 - abs(tail) * EPS > 0  # the integrand e^{h} q grows at +-40 already
    poly3 = exact.restricted_divergence(exact.laplace_pair(EPS), "kl", "poly", degree=3).value
    assert poly3 == pytest.approx(_kl_sup(2), abs=1e-6)


@pytest.mark.parametrize(
    "alpha, degree, documented",
    [(2.0, 1, math.log(1.5)), (2.0, 2, 0.438255), (2.0, 3, 0.474911), (4.0, 1, 0.410577)],
)
def test_renyi_restricted_to_polynomials_matches_a_scipy_optimisation(alpha, degree, documented):
    want = _sup(lambda c: _renyi_value(c, alpha), degree)
    got = exact.restricted_divergence(
        exact.laplace_pair(EPS), "renyi", "poly", degree=degree, alpha=alpha
    ).value
    assert got == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx(documented, abs=2e-6)


def test_the_reference_would_catch_a_solver_one_unit_off_in_the_sixth_digit():
    # Negative control for the tolerance: the poly_2 KL value moved by 2e-6 fails the comparison.
    want = _kl_sup(2)
    assert not (want + 2e-6 == pytest.approx(want, abs=1e-6))


def test_the_composite_rule_agrees_with_scipy_quad():
    # The quadrature the reference uses, against scipy.integrate.quad on the optimum's integrands.
    c = np.array([0.3, -0.05])
    h = np.polynomial.Polynomial(np.concatenate([[0.0], c]))
    for f, law, law_name in ((h, P, "P"), (lambda x: np.exp(h(x)), Q, "Q")):
        quad = integrate.quad(lambda x: f(x) * law.pdf(x), LO, HI, points=KINKS, limit=400)[0]
        assert _mean(f, law_name) == pytest.approx(quad, rel=1e-10)


@pytest.mark.parametrize(
    "divergence, alpha, degree",
    [("kl", None, 4), ("renyi", 4.0, 2), ("renyi", 4.0, 4), ("alpha", 3.0, 2), ("alpha", 3.0, 4)],
)
def test_higher_degrees_match_the_reference(divergence, alpha, degree):
    # Degrees the snapshot tests/data/exact_baseline.json was the only check for. The alpha-divergence
    # of a cone class is the Renyi value mapped back, (exp((alpha - 1) R) - 1) / (alpha (alpha - 1))
    # (paper eq. (3)); a quartic KL critic needs a negative leading coefficient (else E_Q e^h = inf).
    if divergence == "kl":
        want = _kl_sup(degree)
    else:
        renyi = _sup(lambda c: _renyi_value(c, alpha), degree)
        want = (
            renyi
            if divergence == "renyi"
            else math.expm1((alpha - 1) * renyi) / (alpha * (alpha - 1))
        )
    got = exact.restricted_divergence(
        exact.laplace_pair(EPS), divergence, "poly", degree=degree, alpha=alpha
    ).value
    assert got == pytest.approx(want, abs=1e-6)
