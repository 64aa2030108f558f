"""Exact (quadrature + Newton) divergences against closed forms, the theory notes' (docs/theory/mechanisms.md) checked values and scipy.

Tolerances. The quadrature is composite Gauss-Legendre split at every kink with graded panels at the
roots of h; on smooth pieces it is accurate to ~1e-13 relative and the Newton solver stops at a
decrement of 1e-10 relative (value error ~1e-20), so agreement with closed forms is asserted at 1e-9
relative, well inside the 1e-6 the exact layer promises. docs/theory/mechanisms.md prints 6 decimals, so its example
values are compared at 6e-7 absolute (half a unit in the last place plus float noise).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize

from cbdp_jax import InvalidParameterError
from cbdp_jax import analytic as an
from cbdp_jax.exact import (
    ExactResult,
    NoisePair,
    gaussian_pair,
    laplace_pair,
    noise_pair_from,
    output_laws,
    point_mass_pair,
    restricted_divergence,
    restricted_divergence_curve,
    unrestricted_divergence,
)

REL = 1e-9  # closed forms vs quadrature (see module docstring)
MD = 6e-7  # the theory notes' (docs/theory/mechanisms.md) six printed decimals


# Closed forms typed here from docs/theory/mechanisms.md, independent of cbdp_jax.analytic.
def lin_kl_laplace_formula(e):
    s = math.sqrt(1.0 + e * e)
    return math.log(1.0 - ((1.0 - s) / e) ** 2) + s - 1.0


def kl_laplace_formula(eps, v):
    return sum(eps * abs(x) - 1.0 + math.exp(-eps * abs(x)) for x in np.atleast_1d(v))


def renyi_laplace_formula(alpha, eps, v):
    c = 1.0 / (4.0 * alpha - 2.0)
    return sum(
        math.log(
            (0.5 + c) * math.exp((alpha - 1) * eps * abs(x))
            + (0.5 - c) * math.exp(-alpha * eps * abs(x))
        )
        for x in np.atleast_1d(v)
    ) / (alpha - 1.0)


def sq_norm(v):
    return float(np.sum(np.square(v)))


# --------------------------------------------------------------------------------------------------
# Closed forms (docs/theory/mechanisms.md / paper Table 1)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0, 20.0])
def test_lin_kl_laplace_matches_closed_form(eps):
    r = restricted_divergence(laplace_pair(eps), "kl")
    assert r.converged and r.reason is None
    assert r.value == pytest.approx(lin_kl_laplace_formula(eps), rel=REL)
    assert r.value == pytest.approx(an.laplace_lin_kl(eps), rel=REL)
    # Setting d/da [-a v + log(1 - a^2 / eps^2)] = 0 (DV objective, E_Q exp(a x) = e^a / (1 - a^2/eps^2))
    # gives the optimal slope a* = 1 - sqrt(1 + eps^2).
    assert r.theta[1] == pytest.approx(1.0 - math.sqrt(1.0 + eps * eps), rel=1e-6)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.0, 5.0])
def test_lin_kl_gaussian_equals_kl(sigma):
    r = restricted_divergence(gaussian_pair(sigma), "kl")
    assert r.converged
    assert r.value == pytest.approx(1.0 / (2.0 * sigma**2), rel=REL)
    assert r.value == pytest.approx(an.gaussian_lin_kl(sigma), rel=REL)


def test_lin_kl_decomposes_over_coordinates():
    v = [1.0, 0.5, 0.0]
    r = restricted_divergence(laplace_pair(1.0, v), "kl")
    want = lin_kl_laplace_formula(1.0) + lin_kl_laplace_formula(0.5)
    assert r.value == pytest.approx(want, rel=REL)
    assert r.value == pytest.approx(an.laplace_lin_kl(1.0, v), rel=REL)
    assert r.theta.shape == (4,) and r.theta[3] == 0.0
    g = restricted_divergence(gaussian_pair(0.7, v), "kl")
    assert g.value == pytest.approx(sq_norm(v) / (2 * 0.49), rel=REL)


@pytest.mark.parametrize("sens", [1.0, (1.0, 0.5)], ids=["1d", "2d"])
@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_unrestricted_laplace_kl_and_renyi(eps, sens):
    pair = laplace_pair(eps, sens)
    kl = unrestricted_divergence(pair, "kl").value
    assert kl == pytest.approx(kl_laplace_formula(eps, sens), rel=REL)
    assert kl == pytest.approx(an.laplace_kl(eps, sens), rel=REL)
    for alpha in (1.01, 1.5, 2.0, 4.0, 10.0, 50.0):
        r = unrestricted_divergence(pair, "renyi", alpha=alpha).value
        assert r == pytest.approx(renyi_laplace_formula(alpha, eps, sens), rel=REL)
        assert r == pytest.approx(an.laplace_renyi(alpha, eps, sens), rel=REL)


@pytest.mark.parametrize("sens", [1.0, (1.0, 0.5)], ids=["1d", "2d"])
@pytest.mark.parametrize("sigma", [0.2, 1.0, 5.0])
def test_unrestricted_gaussian_kl_and_renyi(sigma, sens):
    pair = gaussian_pair(sigma, sens)
    kl = unrestricted_divergence(pair, "kl").value
    assert kl == pytest.approx(sq_norm(sens) / (2 * sigma**2), rel=REL)
    assert kl == pytest.approx(an.gaussian_kl(sigma, sens), rel=REL)
    for alpha in (1.01, 2.0, 4.0, 10.0, 50.0):
        r = unrestricted_divergence(pair, "renyi", alpha=alpha).value
        assert r == pytest.approx(alpha * sq_norm(sens) / (2 * sigma**2), rel=REL)
        assert r == pytest.approx(an.gaussian_renyi(alpha, sigma, sens), rel=REL)


@pytest.mark.parametrize(
    "pair", [laplace_pair(1.0), gaussian_pair(1.5)], ids=["laplace", "gaussian"]
)
def test_unrestricted_other_divergences_match_scipy(pair):
    laws = output_laws(pair)

    def dens(x, loc):
        if laws.family == "laplace":
            return math.exp(-abs(x - loc) / laws.scale) / (2 * laws.scale)
        return math.exp(-0.5 * ((x - loc) / laws.scale) ** 2) / (
            laws.scale * math.sqrt(2 * math.pi)
        )

    fs = {
        "tv": lambda p, q: 0.5 * abs(p - q),
        "hellinger": lambda p, q: (math.sqrt(p) - math.sqrt(q)) ** 2,
        "chi2": lambda p, q: (p - q) ** 2 / q,
        "js": lambda p, q: p * math.log(2 * p / (p + q)) + q * math.log(2 * q / (p + q)),
    }
    for name, g in fs.items():
        want = integrate.quad(
            lambda x: g(dens(x, 0.0), dens(x, 1.0)), -40, 41, points=[0, 0.5, 1], limit=400
        )[0]
        # scipy's adaptive quadrature is good to ~1e-10 here.
        assert unrestricted_divergence(pair, name).value == pytest.approx(want, rel=1e-8)


# --------------------------------------------------------------------------------------------------
# the theory notes' (docs/theory/mechanisms.md) checked example values
# --------------------------------------------------------------------------------------------------

LAP1 = laplace_pair(1.0)

EXAMPLES = [
    # (id, pair, divergence, adversary, degree, alpha, value)
    ("lap1-lin-a4", LAP1, "renyi", "linear", 1, 4.0, 0.410577),
    ("lap1-lin-a2", LAP1, "renyi", "linear", 1, 2.0, 0.405465),
    ("lap1-poly2-a2", LAP1, "renyi", "poly", 2, 2.0, 0.438255),
    ("lap1-poly3-a2", LAP1, "renyi", "poly", 3, 2.0, 0.474911),
    ("lap1-lin-kl", LAP1, "kl", "linear", 1, None, 0.225987),
    ("lap1-poly2-kl", LAP1, "kl", "poly", 2, None, 0.261403),
    ("lap1-poly3-kl", LAP1, "kl", "poly", 3, None, 0.261403),
    ("lap.5-lin-a4", laplace_pair(0.5), "renyi", "linear", 1, 4.0, 0.148649),
    ("lap.5-lin-a7", laplace_pair(0.5), "renyi", "linear", 1, 7.0, 0.154682),
    ("gau2-lin-a4", gaussian_pair(2.0), "renyi", "linear", 1, 4.0, 0.259270),
    ("gau2-lin-a7", gaussian_pair(2.0), "renyi", "linear", 1, 7.0, 0.261861),
]


@pytest.mark.parametrize(
    "pair, divergence, adversary, degree, alpha, want",
    [e[1:] for e in EXAMPLES],
    ids=[e[0] for e in EXAMPLES],
)
def test_math_md_example_values(pair, divergence, adversary, degree, alpha, want):
    r = restricted_divergence(pair, divergence, adversary, degree=degree, alpha=alpha)
    assert r.converged, r.reason
    assert r.value == pytest.approx(want, abs=MD)


def test_lin_renyi_alpha2_is_log_1_5():
    assert restricted_divergence(LAP1, "renyi", alpha=2.0).value == pytest.approx(
        math.log(1.5), rel=REL
    )


@pytest.mark.parametrize(
    "pair, var", [(laplace_pair(0.01), 2e4), (laplace_pair(3.0), 2 / 9), (gaussian_pair(0.7), 0.49)]
)
def test_lin_renyi_order_two_closed_form(pair, var):
    """At alpha = 2 (A = 2) the scale-free problem min_u E_Q[(1 + u (x - E_P x))^2] is least squares:
    the minimum is Var_Q / (Var_Q + v^2), so (lin, Renyi_2) = log(1 + v^2 / Var_Q) (v = 1 here)."""
    r = restricted_divergence(pair, "renyi", alpha=2.0)
    assert r.value == pytest.approx(math.log1p(1.0 / var), rel=REL)


def test_math_md_unrestricted_examples():
    assert unrestricted_divergence(LAP1, "renyi", alpha=4.0).value == pytest.approx(
        0.813689, abs=MD
    )
    assert unrestricted_divergence(LAP1, "renyi", alpha=2.0).value == pytest.approx(
        0.619124, abs=MD
    )
    assert unrestricted_divergence(LAP1, "kl").value == pytest.approx(0.367879, abs=MD)
    assert float(unrestricted_divergence(LAP1, "kl")) == unrestricted_divergence(LAP1, "kl").value


def test_kl_odd_leading_coefficient_is_zero():
    r2 = restricted_divergence(LAP1, "kl", "poly", degree=2)
    r3 = restricted_divergence(LAP1, "kl", "poly", degree=3)
    assert r3.theta.shape == (4,) and r3.theta[3] == 0.0
    assert r3.value == pytest.approx(r2.value, rel=REL)
    assert r2.theta[2] < 0  # the even leading coefficient is negative (E_Q exp h finite)


@pytest.mark.parametrize(
    "pair, alpha, printed",
    [
        (laplace_pair(0.5), 4.0, 0.135155),
        (laplace_pair(0.5), 7.0, 0.067578),
        (gaussian_pair(2.0), 4.0, 0.228431),
        (gaussian_pair(2.0), 7.0, 0.179615),
    ],
)
def test_printed_bound_is_violated_and_corrected_bound_holds(pair, alpha, printed):
    exact = restricted_divergence(pair, "renyi", alpha=alpha).value
    laws = output_laws(pair)
    if laws.family == "laplace":
        paper = an.laplace_lin_renyi_upper_bound(alpha, 1.0 / laws.scale, form="paper")
        corrected = an.laplace_lin_renyi_upper_bound(alpha, 1.0 / laws.scale)
    else:
        paper = an.gaussian_lin_renyi_upper_bound(alpha, laws.scale, form="paper")
        corrected = an.gaussian_lin_renyi_upper_bound(alpha, laws.scale)
    assert paper == pytest.approx(printed, abs=MD)
    assert exact > paper
    assert exact < corrected


# --------------------------------------------------------------------------------------------------
# Orderings (hypothesis)
# --------------------------------------------------------------------------------------------------

SLACK = 1e-9


@settings(max_examples=8, deadline=None)
@given(
    family=st.sampled_from(["laplace", "gaussian"]),
    noise=st.floats(0.4, 2.5),
    alpha=st.floats(1.2, 8.0),
)
def test_capacity_ordering(family, noise, alpha):
    """lin <= poly_2 <= poly_3 <= unrestricted, for Renyi and KL (larger class, larger sup)."""
    pair = laplace_pair(noise) if family == "laplace" else gaussian_pair(noise)
    for div, a in (("renyi", alpha), ("kl", None)):
        vals = [
            restricted_divergence(pair, div, "linear", alpha=a),
            restricted_divergence(pair, div, "poly", degree=2, alpha=a),
            restricted_divergence(pair, div, "poly", degree=3, alpha=a),
        ]
        assert all(r.converged for r in vals), [r.reason for r in vals]
        full = unrestricted_divergence(pair, div, alpha=a).value
        chain = [r.value for r in vals] + [full]
        assert all(lo <= hi + SLACK for lo, hi in zip(chain[:-1], chain[1:], strict=True)), chain


# --------------------------------------------------------------------------------------------------
# Forms, conventions, degenerate and separable cases
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pair, div, adv, degree, alpha",
    [
        (LAP1, "renyi", "linear", 1, 4.0),
        (LAP1, "renyi", "poly", 3, 1.5),
        (gaussian_pair(0.8), "renyi", "poly", 2, 6.0),
        (LAP1, "alpha", "linear", 1, 3.0),
        (LAP1, "kl", "poly", 2, None),
        (gaussian_pair(1.3), "kl", "linear", 1, None),
    ],
)
def test_fform_at_optimum_equals_tight_form(pair, div, adv, degree, alpha):
    r = restricted_divergence(pair, div, adv, degree=degree, alpha=alpha)
    # The plain f-form (Divergence.conjugate at the rescaled / shifted optimum; ``f_value``) and the
    # solver's form (scale-free Renyi / Donsker-Varadhan; ``tight_value`` = ``value``) differ only by
    # rounding at the optimum.
    plain = (
        math.log1p(alpha * (alpha - 1) * r.f_value) / (alpha - 1) if div == "renyi" else r.f_value
    )
    assert plain == pytest.approx(r.tight_value, rel=1e-10, abs=1e-13)
    assert r.value == r.tight_value


def test_theta_reproduces_value_under_scipy():
    """The returned theta, plugged into the plain f-form with scipy quadrature, gives the value."""
    alpha = 4.0
    r = restricted_divergence(LAP1, "renyi", alpha=alpha)
    b, a = r.theta
    big_a = alpha / (alpha - 1)
    c_a = (alpha - 1) ** big_a / alpha

    def conj(s):
        return c_a * abs(s) ** big_a + 1 / (alpha**2 - alpha)

    def lap(x, loc):
        return 0.5 * math.exp(-abs(x - loc))

    root = -b / a
    pts = sorted([0.0, 1.0, root])
    e_p = integrate.quad(lambda x: (b + a * x) * lap(x, 0.0), -60, 61, points=pts, limit=400)[0]
    e_q = integrate.quad(lambda x: conj(b + a * x) * lap(x, 1.0), -60, 61, points=pts, limit=400)[0]
    d_alpha = e_p - e_q
    assert math.log1p(alpha * (alpha - 1) * d_alpha) / (alpha - 1) == pytest.approx(
        0.410577, abs=MD
    )
    assert d_alpha == pytest.approx(r.f_value, rel=1e-8)


@pytest.mark.parametrize(
    "pair", [LAP1, laplace_pair(0.5), gaussian_pair(1.0)], ids=["lap1", "lap.5", "gau1"]
)
@pytest.mark.parametrize("alpha", [1.5, 4.0])
def test_nonneg_convention_is_at_least_abs(pair, alpha):
    """f* on t >= 0 is C max(s, 0)^A + c <= C |s|^A + c, so the objective and its sup are larger."""
    r_abs = restricted_divergence(pair, "renyi", alpha=alpha)
    r_non = restricted_divergence(pair, "renyi", alpha=alpha, convention="nonneg")
    assert r_non.converged
    assert r_non.value >= r_abs.value - 1e-12
    assert r_non.value <= unrestricted_divergence(pair, "renyi", alpha=alpha).value + SLACK


@pytest.mark.parametrize(
    "div, alpha", [("kl", None), ("renyi", 2.0), ("alpha", 3.0), ("chi2", None)]
)
@pytest.mark.parametrize("adv, degree", [("linear", 1), ("poly", 3)])
def test_point_masses_are_infinitely_far(div, alpha, adv, degree):
    r = restricted_divergence(point_mass_pair(1.0), div, adv, degree=degree, alpha=alpha)
    assert r.value == math.inf and r.f_value == math.inf
    assert "Lemma 2" in r.reason
    assert not np.isnan(r.value)


def test_point_masses_unrestricted_and_equal():
    assert unrestricted_divergence(point_mass_pair(2.0), "kl").value == math.inf
    assert unrestricted_divergence(point_mass_pair(2.0), "renyi", alpha=3.0).value == math.inf
    assert unrestricted_divergence(point_mass_pair(2.0), "tv").value == 1.0
    same = restricted_divergence(point_mass_pair(0.0), "kl")
    assert same.value == 0.0 and "P = Q" in same.reason


def test_point_masses_with_feature_map():
    sep = restricted_divergence(
        point_mass_pair(1.0), "renyi", lambda x: np.sin(x)[:, None], alpha=2.0
    )
    assert sep.value == math.inf
    periodic = restricted_divergence(
        point_mass_pair(2 * math.pi), "kl", lambda x: np.sin(x)[:, None]
    )
    assert periodic.value == pytest.approx(0.0, abs=1e-12) and "same value" in periodic.reason


@pytest.mark.parametrize("div", ["tv", "hellinger", "js"])
@pytest.mark.parametrize("pair", [LAP1, gaussian_pair(1.0)], ids=["laplace", "gaussian"])
def test_bounded_conjugates_give_zero_for_polynomials(div, pair):
    for adv, k in (("linear", 1), ("poly", 2)):
        r = restricted_divergence(pair, div, adv, degree=k)
        assert r.value == 0.0 and "degenerate" in r.reason


def test_chi2_linear_is_mean_difference_squared_over_variance():
    eps, sigma = 1.7, 0.6
    # Laplace: Var = 2 / eps^2, Gaussian: Var = sigma^2; mean difference v.
    assert restricted_divergence(laplace_pair(eps), "chi2").value == pytest.approx(
        eps**2 / 2, rel=REL
    )
    assert restricted_divergence(gaussian_pair(sigma), "chi2").value == pytest.approx(
        1 / sigma**2, rel=REL
    )
    v = (1.0, 0.5)
    r = restricted_divergence(laplace_pair(eps, v), "chi2")
    assert r.value == pytest.approx(sum((eps * x) ** 2 / 2 for x in v), rel=REL)


# --------------------------------------------------------------------------------------------------
# d-dimensional linear Renyi, feature maps, curves, mechanisms
# --------------------------------------------------------------------------------------------------


def test_gaussian_multidim_lin_renyi_reduces_to_norm():
    v = (1.0, 0.5)
    r2 = restricted_divergence(gaussian_pair(1.0, v), "renyi", alpha=4.0)
    r1 = restricted_divergence(gaussian_pair(1.0, math.hypot(*v)), "renyi", alpha=4.0)
    assert r2.value == pytest.approx(r1.value, rel=REL)
    assert r2.theta[2] / r2.theta[1] == pytest.approx(0.5, rel=1e-9)  # a is parallel to v


def _sum_of_laplaces_pdf(s, b1, b2):
    # Density of b1 L1 + b2 L2 (L standard Laplace, b1 != b2), from the partial fractions of the
    # product of characteristic functions 1 / ((1 + b1^2 t^2)(1 + b2^2 t^2)).
    return (b1 * math.exp(-abs(s) / b1) - b2 * math.exp(-abs(s) / b2)) / (2 * (b1 * b1 - b2 * b2))


@pytest.mark.parametrize("eps, v", [(1.0, (1.0, 0.5)), (2.0, (0.6, -0.25))])
def test_laplace_2d_lin_renyi_against_independent_1d_reduction(eps, v):
    """2-D nested quadrature vs scipy: u.x under Q is u.v plus a sum of two Laplaces (closed density)."""
    alpha = 4.0
    big_a = alpha / (alpha - 1)
    v = np.asarray(v)

    def g(u):  # E_Q |1 + u.x|^A (E_P[1 + u.x] = 1)
        c = float(u @ v)
        b1, b2 = abs(u[0]) / eps, abs(u[1]) / eps
        f = lambda s: abs(1 + c + s) ** big_a * _sum_of_laplaces_pdf(s, b1, b2)  # noqa: E731
        edges = [-np.inf, *sorted([0.0, -(1 + c)]), np.inf]
        return sum(
            integrate.quad(f, a, b, epsrel=1e-13, limit=200)[0]
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        )

    res = optimize.minimize(
        g, x0=[-0.3, -0.1], method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-15)
    )
    want = -math.log(res.fun)
    r = restricted_divergence(laplace_pair(eps, v), "renyi", alpha=alpha)
    assert r.converged
    # Nelder-Mead on an adaptive-quadrature objective is good to ~1e-10 in the value.
    assert r.value == pytest.approx(want, rel=1e-8)
    pair = laplace_pair(eps, v)
    assert r.value <= unrestricted_divergence(pair, "renyi", alpha=alpha).value
    for i in range(2):  # the class contains each 1-D linear class
        assert (
            r.value
            >= restricted_divergence(laplace_pair(eps, v[i]), "renyi", alpha=alpha).value - SLACK
        )


def test_feature_maps_reproduce_polynomial_classes():
    lin = restricted_divergence(LAP1, "renyi", lambda x: x[:, None], alpha=3.0)
    assert lin.value == pytest.approx(
        restricted_divergence(LAP1, "renyi", alpha=3.0).value, rel=1e-9
    )
    quad2 = restricted_divergence(LAP1, "kl", lambda x: np.stack([x, x * x], 1))
    assert quad2.value == pytest.approx(0.261403, abs=MD)


def _rff(n_features=3, seed=0):
    rng = np.random.default_rng(seed)
    w, b = rng.normal(size=n_features), rng.uniform(0, 2 * np.pi, size=n_features)
    return lambda x: np.cos(np.outer(x, w) + b)


def test_random_fourier_features_between_zero_and_unrestricted():
    rff = _rff()
    for div, a in (("kl", None), ("renyi", 3.0), ("chi2", None)):
        r = restricted_divergence(LAP1, div, rff, alpha=a)
        assert r.converged, r.reason
        assert 0.0 < r.value <= unrestricted_divergence(LAP1, div, alpha=a).value
        assert r.value == pytest.approx(r.tight_value, rel=1e-10)


@pytest.mark.parametrize("div", ["hellinger", "js"])
def test_bounded_conjugate_with_feature_map_is_a_feasible_lower_bound(div):
    """f* < +inf needs h < sup everywhere; in the tails, where Q has no mass, nothing but that hard
    constraint limits h, so it can be active at the optimum: then the value is reported as a feasible
    (hence valid lower) value with a reason instead of claiming convergence."""
    r = restricted_divergence(LAP1, div, _rff())
    assert 0.0 < r.value <= unrestricted_divergence(LAP1, div).value
    assert r.converged or "constraint" in r.reason


def test_curve_matches_pointwise():
    alphas = [1.3, 2.0, 5.0]
    curve = restricted_divergence_curve(LAP1, "renyi", alphas, "poly", degree=2)
    for a, r in zip(alphas, curve, strict=True):
        assert r.alpha == a
        single = restricted_divergence(LAP1, "renyi", "poly", degree=2, alpha=a)
        assert r.value == pytest.approx(single.value, rel=1e-10)


def test_mechanism_objects_are_accepted():
    from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism, NonPrivateRelease

    assert noise_pair_from(LaplaceMechanism(epsilon=2.0)) == NoisePair("laplace", 0.5, (1.0,))
    assert noise_pair_from(GaussianMechanism(sigma=1.5, sensitivity=(1.0, 2.0))) == output_laws(
        gaussian_pair(1.5, (1.0, 2.0))
    )
    assert noise_pair_from(NonPrivateRelease(dim=2)).family == "point_mass"
    r = restricted_divergence(LaplaceMechanism(epsilon=1.0), "renyi", alpha=4.0)
    assert isinstance(r, ExactResult) and r.value == pytest.approx(0.410577, abs=MD)


@pytest.mark.slow
@pytest.mark.ci
def test_one_pair_type_for_the_exact_layer_and_the_estimator():
    """The exact layer's constructors return the estimator's NeighbouringPair, and the exact layer
    takes any NeighbouringPair whose laws it knows (a custom query, signed shifts), so one object
    serves both; a pair without closed-form laws is refused by name."""
    import jax.numpy as jnp

    from cbdp_jax.mechanisms import (
        GaussianMechanism,
        NeighbouringPair,
        RandomizedResponse,
        canonical_pair,
    )

    for pair in (laplace_pair(1.0), gaussian_pair(2.0, (1.0, -0.5)), point_mass_pair(3.0)):
        assert isinstance(pair, NeighbouringPair)
    lap = laplace_pair(1.0)
    assert output_laws(lap) == NoisePair("laplace", 1.0, (1.0,))
    # The same value from the constructor, the mechanism's canonical pair and the laws themselves.
    from cbdp_jax.mechanisms import LaplaceMechanism

    values = {
        restricted_divergence(p, "kl", "linear").value
        for p in (lap, canonical_pair(LaplaceMechanism(epsilon=1.0)), output_laws(lap))
    }
    assert len(values) == 1 and values.pop() == pytest.approx(lin_kl_laplace_formula(1.0), rel=REL)
    # A mean query over 4 records: changing one record by 1 shifts the answer by 1/4.
    mean = GaussianMechanism(
        sigma=0.5, sensitivity=(0.25,), query=lambda d: jnp.mean(jnp.asarray(d), keepdims=True)
    )
    custom = NeighbouringPair(mean, jnp.array([0.0, 0.0, 0.0, 1.0]), jnp.zeros(4))
    assert output_laws(custom) == NoisePair("gaussian", 0.5, (-0.25,))
    assert unrestricted_divergence(custom, "kl").value == pytest.approx(
        0.25**2 / (2 * 0.5**2), rel=REL
    )
    with pytest.raises(InvalidParameterError, match="pair.*no closed-form output laws"):
        output_laws(canonical_pair(RandomizedResponse(epsilon=1.0, k=2)))
    # The estimator takes the very same object.
    import jax

    from cbdp_jax.estimator import EstimatorConfig, estimate

    r = estimate(
        jax.random.key(0),
        lap,
        samples=2000,
        adversary="linear",
        divergence="kl",
        config=EstimatorConfig(steps=20, ensemble=1),
    )
    assert math.isfinite(r.estimate)


# --------------------------------------------------------------------------------------------------
# Invalid inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: restricted_divergence(LAP1, "renyi", "cubic", alpha=2.0), "adversary"),
        (lambda: restricted_divergence(LAP1, "renyi", "poly", degree=0, alpha=2.0), "degree"),
        (lambda: restricted_divergence(LAP1, "renyi", "poly", degree=1.5, alpha=2.0), "degree"),
        (lambda: restricted_divergence(LAP1, "renyi", "linear", degree=2, alpha=2.0), "degree"),
        (lambda: restricted_divergence(LAP1, "renyi", alpha=1.0), "alpha"),
        (lambda: restricted_divergence(LAP1, "renyi", alpha=0.5), "alpha"),
        (lambda: restricted_divergence(LAP1, "renyi"), "alpha"),
        (lambda: restricted_divergence(LAP1, "kl", alpha=2.0), "alpha"),
        (lambda: restricted_divergence(LAP1, "wasserstein"), "divergence"),
        (lambda: restricted_divergence(LAP1, "renyi", alpha=2.0, convention="x"), "convention"),
        (lambda: restricted_divergence(LAP1, "kl", n_starts=0), "n_starts"),
        (lambda: restricted_divergence(LAP1, "kl", tol=0.0), "tol"),
        (
            lambda: restricted_divergence(laplace_pair(1.0, (1, 1)), "kl", "poly", degree=2),
            "adversary",
        ),
        (lambda: restricted_divergence(laplace_pair(1.0, (1, 1, 1)), "renyi", alpha=2.0), "pair"),
        (lambda: restricted_divergence(LAP1, "tv", lambda x: np.cos(x)[:, None]), "tv"),
        (lambda: restricted_divergence(LAP1, "kl", lambda x: x[:3]), "adversary"),
        (lambda: restricted_divergence("laplace", "kl"), "pair"),
        (lambda: restricted_divergence_curve(LAP1, "kl", [2.0]), "divergence"),
        (lambda: restricted_divergence_curve(LAP1, "renyi", []), "alphas"),
        (lambda: unrestricted_divergence(LAP1, "renyi", alpha=1.0), "alpha"),
        (lambda: unrestricted_divergence(laplace_pair(1.0, (1, 1)), "tv"), "pair"),
        (lambda: laplace_pair(0.0), "epsilon"),
        (lambda: gaussian_pair(-1.0), "sigma"),
        (lambda: NoisePair("cauchy", 1.0, (1.0,)), "family"),
        (lambda: NoisePair("laplace", 1.0, (math.nan,)), "shift"),
        (lambda: noise_pair_from(object()), "mechanism"),
    ],
)
def test_invalid_inputs_raise_with_parameter_name(call, name):
    with pytest.raises(InvalidParameterError, match=name):
        call()
