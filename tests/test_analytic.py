"""Analytic closed forms and bounds against independent computations.

References are scipy quadrature of the densities (split at every kink, in log space where the integrand
would overflow or underflow), a convex 1-D optimisation for exact restricted values, and dp_accounting's
RDP accountant. d-dimensional values are checked by integrating each coordinate separately and combining
(products of independent coordinates: KL and Renyi add, 1 + chi^2 and the Bhattacharyya coefficient
multiply).
"""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize

from cbdp_jax import InvalidParameterError
from cbdp_jax.analytic import (
    classical_pinsker_ipm_bound,
    classical_pinsker_tv_bound,
    gaussian_chi2,
    gaussian_hellinger,
    gaussian_kl,
    gaussian_lin_kl,
    gaussian_lin_renyi_upper_bound,
    gaussian_renyi,
    gaussian_tv,
    generalization_gap_bound,
    laplace_chi2,
    laplace_hellinger,
    laplace_kl,
    laplace_lin_kl,
    laplace_lin_renyi_upper_bound,
    laplace_renyi,
    laplace_renyi_lower_bound,
    laplace_tv,
    lin_renyi_crossing_alpha,
    matrix_mechanism_lin_renyi_upper_bound,
    pinsker_ipm_bound,
)

ALPHAS = [1.5, 2.0, 4.0, 10.0, 50.0]
VEC = [0.5, 1.0, 2.0]  # a 3-dim sensitivity vector

# quad at epsrel 1e-13 sometimes reports that roundoff stops it short of that (sign-changing KL
# integrands, very peaked Renyi integrands); it still lands far inside the 1e-9 tolerances used below.
pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
INF = np.inf

# --------------------------------------------------------------------------------------------------
# Independent reference: 1-D quadrature of the densities
# --------------------------------------------------------------------------------------------------


def _lap_logpdf(x, loc, eps):
    return math.log(eps / 2.0) - eps * abs(x - loc)


def _gauss_logpdf(x, loc, s):
    return -0.5 * ((x - loc) / s) ** 2 - math.log(s * math.sqrt(2.0 * math.pi))


def _quad(fn, points):
    """Integral of fn over R, split at the sorted breakpoints (kinks and peaks)."""
    pts = sorted(set(points))
    edges = [-INF, *pts, INF]
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        total += integrate.quad(fn, a, b, epsabs=0.0, epsrel=1e-13, limit=400)[0]
    return total


def _mech(mechanism, scale, shift):
    """(log p, log q, breakpoints) for P centred at 0 and Q centred at shift (one coordinate)."""
    if mechanism == "laplace":
        lp = lambda x: _lap_logpdf(x, 0.0, scale)
        lq = lambda x: _lap_logpdf(x, shift, scale)
        return lp, lq, [0.0, shift]
    lp = lambda x: _gauss_logpdf(x, 0.0, scale)
    lq = lambda x: _gauss_logpdf(x, shift, scale)
    return lp, lq, [0.0, shift]


def quad_renyi_1d(mechanism, alpha, scale, shift):
    """log(integral p^a q^(1-a)) / (a - 1), with the integrand's maximum factored out (log space)."""
    lp, lq, pts = _mech(mechanism, scale, shift)
    g = lambda x: alpha * lp(x) + (1.0 - alpha) * lq(x)
    if mechanism == "gaussian":
        pts = [*pts, -(alpha - 1.0) * shift]  # the peak of the (Gaussian-shaped) integrand
    m = max(g(x) for x in pts)
    integral = _quad(lambda x: math.exp(g(x) - m), pts)
    return (m + math.log(integral)) / (alpha - 1.0)


def quad_kl_1d(mechanism, scale, shift):
    lp, lq, pts = _mech(mechanism, scale, shift)
    return _quad(lambda x: math.exp(lp(x)) * (lp(x) - lq(x)), pts)


def quad_tv_1d(mechanism, scale, shift):
    lp, lq, pts = _mech(mechanism, scale, shift)
    pts = [*pts, shift / 2.0]  # where p = q
    return 0.5 * _quad(lambda x: abs(math.exp(lp(x)) - math.exp(lq(x))), pts)


def _q_times_expm1_sq(log_q, y):
    """exp(log_q) * expm1(y)^2 in log space where expm1(y)^2 alone would overflow (far tails)."""
    if y == 0.0:
        return 0.0
    log_abs = y + math.log1p(-math.exp(-y)) if y > 1.0 else math.log(abs(math.expm1(y)))
    return math.exp(log_q + 2.0 * log_abs)


def quad_chi2_1d(mechanism, scale, shift):
    # (p - q)^2 / q = q expm1(log p - log q)^2: no cancellation for small shifts.
    lp, lq, pts = _mech(mechanism, scale, shift)
    return _quad(lambda x: _q_times_expm1_sq(lq(x), lp(x) - lq(x)), pts)


def quad_hellinger_1d(mechanism, scale, shift):
    # (sqrt p - sqrt q)^2 = q expm1((log p - log q)/2)^2.
    lp, lq, pts = _mech(mechanism, scale, shift)
    return _quad(lambda x: _q_times_expm1_sq(lq(x), 0.5 * (lp(x) - lq(x))), pts)


def quad_dim(kind, mechanism, scale, shifts, alpha=None):
    """d-dim value from independent per-coordinate integrals."""
    if kind == "renyi":
        return sum(quad_renyi_1d(mechanism, alpha, scale, v) for v in shifts)
    if kind == "kl":
        return sum(quad_kl_1d(mechanism, scale, v) for v in shifts)
    if kind == "chi2":
        return float(np.prod([1.0 + quad_chi2_1d(mechanism, scale, v) for v in shifts])) - 1.0
    if kind == "hellinger":
        bc = np.prod([1.0 - 0.5 * quad_hellinger_1d(mechanism, scale, v) for v in shifts])
        return 2.0 * (1.0 - float(bc))
    raise AssertionError(kind)


def lin_renyi_exact_1d(mechanism, alpha, scale, shift):
    """Exact (lin, Renyi), paper's |t| convention, via the scale-free cone form (docs/theory/objectives.md).

    With h = 1 + t x (E_P h = 1 since P is centred at 0; any h with E_P h > 0 is a positive multiple of
    one of these), D^lin = -log min_t E_Q |1 + t X|^A, A = alpha/(alpha - 1). Convex in t, so a bounded
    scalar search finds the global minimum.
    """
    big_a = alpha / (alpha - 1.0)
    _, lq, pts = _mech(mechanism, scale, shift)

    def moment(t):
        kinks = pts if t == 0 else [*pts, -1.0 / t]
        return _quad(lambda x: math.exp(lq(x)) * abs(1.0 + t * x) ** big_a, kinks)

    width = 1.0 / scale if mechanism == "laplace" else scale  # the noise scale
    res = optimize.minimize_scalar(
        moment, bounds=(-5.0 / width, 5.0 / width), method="bounded", options={"xatol": 1e-10}
    )
    return -math.log(res.fun)


# --------------------------------------------------------------------------------------------------
# KL and (lin, KL)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.05, 1.0, 3.0])
@pytest.mark.parametrize("sens", [1.0, VEC])
def test_laplace_kl_matches_quadrature(eps, sens):
    shifts = np.atleast_1d(sens)
    # quad at epsrel 1e-13 on each kink-free piece; 1e-9 relative leaves room for summation.
    assert laplace_kl(eps, sens) == pytest.approx(
        quad_dim("kl", "laplace", eps, shifts), rel=1e-9, abs=1e-15
    )


@pytest.mark.parametrize("s", [0.5, 2.0])
@pytest.mark.parametrize("sens", [1.0, VEC])
def test_gaussian_kl_and_lin_kl_match_quadrature(s, sens):
    ref = quad_dim("kl", "gaussian", s, np.atleast_1d(sens))
    assert gaussian_kl(s, sens) == pytest.approx(ref, rel=1e-9)  # smooth integrand, quad ~1e-13
    assert gaussian_lin_kl(s, sens) == pytest.approx(ref, rel=1e-9)


def _dv_lin_kl_1d(mechanism, scale, shift, a_max):
    """sup_a a E_P[X] - log E_Q[exp(a X)] (Donsker-Varadhan over lin; E_P X = 0), mgf by quadrature."""
    _, lq, pts = _mech(mechanism, scale, shift)

    def neg(a):
        # log E_Q exp(aX), with the maximum of log q(x) + a x at the kink / peak factored out
        g = lambda x: lq(x) + a * x
        peaks = [*pts] if mechanism == "laplace" else [*pts, shift + a * scale**2]
        m = max(g(x) for x in peaks)
        return m + math.log(_quad(lambda x: math.exp(g(x) - m), peaks))

    res = optimize.minimize_scalar(
        neg, bounds=(-a_max, a_max), method="bounded", options={"xatol": 1e-12}
    )
    return -res.fun


@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_laplace_lin_kl_matches_donsker_varadhan_optimisation(eps):
    # E_Q exp(aX) is finite only for |a| < eps; search |a| <= eps(1 - 1e-6). The bounded search fixes a
    # to ~1e-8 and the objective is flat at its maximum, so the value is good to ~1e-12; tolerance 1e-8.
    ref = _dv_lin_kl_1d("laplace", eps, 1.0, eps * (1 - 1e-6))
    assert laplace_lin_kl(eps) == pytest.approx(ref, rel=1e-8)
    # d-dim: the DV objective separates over coordinates (independent Q), so the sup is the sum.
    ref_d = sum(_dv_lin_kl_1d("laplace", eps, v, eps * (1 - 1e-6)) for v in VEC)
    assert laplace_lin_kl(eps, VEC) == pytest.approx(ref_d, rel=1e-8)


def test_gaussian_lin_kl_matches_donsker_varadhan_optimisation():
    ref = _dv_lin_kl_1d("gaussian", 1.5, 1.0, 10.0)
    assert gaussian_lin_kl(1.5) == pytest.approx(ref, rel=1e-8)  # as above


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(min_value=0.01, max_value=20.0))
def test_lin_kl_below_kl(eps):
    # Independent of both formulas being right: the restricted sup is over a subset.
    assert laplace_lin_kl(eps) <= laplace_kl(eps)
    assert laplace_lin_kl(eps, VEC) <= laplace_kl(eps, VEC)


def test_small_epsilon_series_branches_match_leading_terms():
    # For e = 1e-6 the leading Taylor terms are exact to relative ~e: KL ~ e^2/2, lin-KL ~ e^2/4,
    # Renyi ~ alpha e^2/2, chi^2 ~ e^2, H^2 ~ e^2/4. A naive e - 1 + exp(-e) would be off by ~1e-4.
    e = 1e-6
    assert laplace_kl(e) == pytest.approx(e**2 / 2, rel=1e-5)
    assert laplace_lin_kl(e) == pytest.approx(e**2 / 4, rel=1e-5)
    assert laplace_renyi(1.5, e) == pytest.approx(1.5 * e**2 / 2, rel=1e-5)
    assert laplace_chi2(e) == pytest.approx(e**2, rel=1e-5)
    assert laplace_hellinger(e) == pytest.approx(e**2 / 4, rel=1e-5)


# --------------------------------------------------------------------------------------------------
# Renyi
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
@pytest.mark.parametrize("sens", [1.0, VEC])
def test_laplace_renyi_matches_quadrature(alpha, eps, sens):
    ref = quad_dim("renyi", "laplace", eps, np.atleast_1d(sens), alpha)
    # log-space quadrature, relative accuracy ~1e-13 of (alpha-1) D plus the factored max; 1e-9 is safe.
    assert laplace_renyi(alpha, eps, sens) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("s", [0.7, 3.0])
@pytest.mark.parametrize("sens", [1.0, VEC])
def test_gaussian_renyi_matches_quadrature(alpha, s, sens):
    ref = quad_dim("renyi", "gaussian", s, np.atleast_1d(sens), alpha)
    assert gaussian_renyi(alpha, s, sens) == pytest.approx(ref, rel=1e-9)  # as above


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_laplace_renyi_matches_dp_accounting(eps):
    orders = [1.05, *ALPHAS]
    acc = rdp_privacy_accountant.RdpAccountant(orders=orders)
    acc.compose(dp_event.LaplaceDpEvent(noise_multiplier=1.0 / eps))
    # Both evaluate the same closed form in float64 (theirs: eps + log1p(...)/(a-1)); 1e-9 relative.
    for order, rdp in zip(acc.orders, acc.rdp, strict=True):
        assert laplace_renyi(float(order), eps) == pytest.approx(rdp, rel=1e-9)


@pytest.mark.parametrize("s", [0.5, 1.0, 4.0])
def test_gaussian_renyi_matches_dp_accounting(s):
    acc = rdp_privacy_accountant.RdpAccountant(orders=ALPHAS)
    acc.compose(dp_event.GaussianDpEvent(noise_multiplier=s))
    for order, rdp in zip(acc.orders, acc.rdp, strict=True):
        assert gaussian_renyi(float(order), s) == pytest.approx(rdp, rel=1e-9)  # as above


def test_extreme_inputs_are_finite_and_accurate():
    # alpha = 100, eps = 20: (alpha-1) eps = 1980 overflows a naive exp. Checked against log-space quad.
    for sens in (1.0, VEC):
        value = laplace_renyi(100.0, 20.0, sens)
        assert math.isfinite(value)
        ref = quad_dim("renyi", "laplace", 20.0, np.atleast_1d(sens), 100.0)
        assert value == pytest.approx(ref, rel=1e-9)
        for form in ("paper", "corrected"):
            assert math.isfinite(laplace_lin_renyi_upper_bound(100.0, 20.0, sens, form=form))
            assert math.isfinite(gaussian_lin_renyi_upper_bound(100.0, 0.05, sens, form=form))
        for fn in (laplace_kl, laplace_lin_kl, laplace_hellinger, laplace_renyi_lower_bound):
            args = (100.0, 20.0, sens) if fn is laplace_renyi_lower_bound else (20.0, sens)
            assert math.isfinite(fn(*args))
    assert matrix_mechanism_lin_renyi_upper_bound(100.0, 20.0, 50) < INF
    # chi^2 = e^{D_2} - 1 with D_2 ~ 1000 genuinely exceeds float64: +inf, not an exception or NaN.
    assert laplace_chi2(20.0, [20.0, 20.0, 20.0]) == INF


@pytest.mark.parametrize("alpha", [1.01, 1.5, 2.0, 4.0, 10.0, 50.0, 100.0])
@pytest.mark.parametrize("eps", [0.01, 0.5, 1.0, 5.0, 20.0])
def test_laplace_renyi_lower_bound_below_quadrature(alpha, eps):
    ref = quad_dim("renyi", "laplace", eps, np.atleast_1d(VEC), alpha)
    # Small slack for the quadrature's relative error only.
    assert laplace_renyi_lower_bound(alpha, eps, VEC) <= ref * (1 + 1e-10) + 1e-14
    assert laplace_renyi_lower_bound(alpha, eps) <= laplace_renyi(alpha, eps)


# --------------------------------------------------------------------------------------------------
# TV, chi^2, squared Hellinger
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.2, 1.0, 6.0])
def test_laplace_tv_chi2_hellinger_match_quadrature(eps):
    # Piecewise-smooth integrands split at every kink; quad ~1e-13, tolerance 1e-9 relative.
    assert laplace_tv(eps) == pytest.approx(quad_tv_1d("laplace", eps, 1.0), rel=1e-9)
    assert laplace_tv(eps, 0.7) == pytest.approx(quad_tv_1d("laplace", eps, 0.7), rel=1e-9)
    for sens in (1.0, VEC):
        shifts = np.atleast_1d(sens)
        assert laplace_chi2(eps, sens) == pytest.approx(
            quad_dim("chi2", "laplace", eps, shifts), rel=1e-9
        )
        assert laplace_hellinger(eps, sens) == pytest.approx(
            quad_dim("hellinger", "laplace", eps, shifts), rel=1e-9
        )


@pytest.mark.parametrize("s", [0.6, 1.0, 3.0])
def test_gaussian_tv_chi2_hellinger_match_quadrature(s):
    assert gaussian_tv(s) == pytest.approx(quad_tv_1d("gaussian", s, 1.0), rel=1e-9)  # as above
    for sens in (1.0, VEC):
        shifts = np.atleast_1d(sens)
        assert gaussian_chi2(s, sens) == pytest.approx(
            quad_dim("chi2", "gaussian", s, shifts), rel=1e-9
        )
        assert gaussian_hellinger(s, sens) == pytest.approx(
            quad_dim("hellinger", "gaussian", s, shifts), rel=1e-9
        )


def test_gaussian_tv_two_dim_matches_double_integral():
    # TV does not factor over coordinates: integrate |p - q| / 2 over R^2 with nested quad, the inner
    # integral split at the line p = q (x . v = |v|^2 / 2). Nested quad reaches ~1e-11; tolerance 1e-8.
    s, v = 1.3, np.array([0.6, 1.1])
    c = 1.0 / (2.0 * math.pi * s * s)

    def inner(x):
        ystar = (v @ v / 2.0 - v[0] * x) / v[1]
        g = lambda y: (
            c
            * abs(
                math.exp(-(x * x + y * y) / (2 * s * s))
                - math.exp(-((x - v[0]) ** 2 + (y - v[1]) ** 2) / (2 * s * s))
            )
        )
        return (
            integrate.quad(g, -INF, ystar, epsabs=1e-14, epsrel=1e-12)[0]
            + integrate.quad(g, ystar, INF, epsabs=1e-14, epsrel=1e-12)[0]
        )

    ref = 0.5 * integrate.quad(inner, -INF, INF, epsabs=1e-13, epsrel=1e-12)[0]
    assert gaussian_tv(s, v) == pytest.approx(ref, rel=1e-8)


def test_laplace_tv_rejects_vector_sensitivity():
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        laplace_tv(1.0, VEC)


# --------------------------------------------------------------------------------------------------
# (lin, Renyi) upper bounds, docs/theory/mechanisms.md numbers, crossings
# --------------------------------------------------------------------------------------------------


def test_math_md_example_values():
    # docs/theory/mechanisms.md prints 6 decimals; half a unit in the last place.
    tol = 5e-7
    assert laplace_renyi(4.0, 1.0) == pytest.approx(0.813689, abs=tol)
    assert laplace_lin_renyi_upper_bound(4.0, 1.0, form="paper") == pytest.approx(0.732408, abs=tol)
    assert laplace_lin_kl(1.0) == pytest.approx(0.225987, abs=tol)
    assert laplace_kl(1.0) == pytest.approx(0.367879, abs=tol)
    assert laplace_lin_renyi_upper_bound(4.0, 0.5, form="paper") == pytest.approx(0.135155, abs=tol)
    assert laplace_lin_renyi_upper_bound(7.0, 0.5, form="paper") == pytest.approx(0.067578, abs=tol)
    assert gaussian_lin_renyi_upper_bound(4.0, 2.0, form="paper") == pytest.approx(
        0.228431, abs=tol
    )
    assert gaussian_lin_renyi_upper_bound(7.0, 2.0, form="paper") == pytest.approx(
        0.179615, abs=tol
    )
    # The Renyi-DP values also checked by quadrature at the same point.
    assert laplace_renyi(4.0, 1.0) == pytest.approx(
        quad_renyi_1d("laplace", 4.0, 1.0, 1.0), rel=1e-9
    )


@pytest.mark.parametrize(
    ("mechanism", "scale", "alpha", "exact_math_md"),
    [
        ("laplace", 1.0, 4.0, 0.410577),
        ("laplace", 0.5, 4.0, 0.148649),
        ("laplace", 0.5, 7.0, 0.154682),
        ("gaussian", 2.0, 4.0, 0.259270),
        ("gaussian", 2.0, 7.0, 0.261861),
        ("laplace", 1.0, 2.0, math.log(1.5)),
        ("laplace", 3.0, 10.0, None),
        ("gaussian", 0.7, 3.0, None),
    ],
)
def test_printed_bound_fails_where_math_md_says_and_corrected_bound_holds(
    mechanism, scale, alpha, exact_math_md
):
    exact = lin_renyi_exact_1d(mechanism, alpha, scale, 1.0)
    if exact_math_md is not None:
        # The bounded scalar search and quad give ~1e-9; docs/theory/mechanisms.md prints 6 decimals.
        assert exact == pytest.approx(exact_math_md, abs=1e-6)
    bound = (
        laplace_lin_renyi_upper_bound if mechanism == "laplace" else gaussian_lin_renyi_upper_bound
    )
    assert bound(alpha, scale, form="corrected") >= exact
    if exact_math_md is not None and exact_math_md in (0.148649, 0.154682, 0.259270, 0.261861):
        assert (
            bound(alpha, scale, form="paper") < exact
        )  # the counterexamples of docs/theory/mechanisms.md


def test_corrected_bound_exceeds_paper_bound_by_construction():
    # corrected = (1/(a-1)) log(2^{d(a-1)} (1 + x)) >= (1/(a-1)) log(1 + 2^{d(a-1)} x): check the algebra
    # with an independent float evaluation of both printed formulas.
    for a in (2.0, 3.5, 9.0):
        for eps in (0.3, 1.0, 2.0):
            v = np.array(VEC)
            x = (eps * np.sum(v**a) ** (1 / a)) ** a
            paper = math.log1p(2 ** (3 * (a - 1)) * x) / (a - 1)
            corrected = 3 * math.log(2) + math.log1p(x) / (a - 1)
            assert laplace_lin_renyi_upper_bound(a, eps, v, form="paper") == pytest.approx(
                paper, rel=1e-12
            )
            assert laplace_lin_renyi_upper_bound(a, eps, v) == pytest.approx(corrected, rel=1e-12)
            g = (math.pi / 2) ** ((a - 1) / 2) * np.sum(v**a) / eps**a  # eps plays sigma here
            assert gaussian_lin_renyi_upper_bound(a, eps, v, form="paper") == pytest.approx(
                math.log1p(2 ** (3 * (a - 1)) * g) / (a - 1), rel=1e-12
            )
            assert gaussian_lin_renyi_upper_bound(a, eps, v) == pytest.approx(
                3 * math.log(2) + math.log1p(g) / (a - 1), rel=1e-12
            )
            assert corrected >= paper


def test_matrix_mechanism_bound_is_theorem_5():
    # Theorem 5 as printed: (1/(a-1)) log(1 + 2^{s(a-1)} eps^a); corrected: s log 2 + log1p(eps^a)/(a-1).
    for a, eps, s in ((2.0, 1.0, 1), (4.0, 0.5, 3), (10.0, 2.0, 8)):
        paper = math.log1p(2 ** (s * (a - 1)) * eps**a) / (a - 1)
        assert matrix_mechanism_lin_renyi_upper_bound(a, eps, s, form="paper") == pytest.approx(
            paper, rel=1e-12
        )
        assert matrix_mechanism_lin_renyi_upper_bound(a, eps, s) == pytest.approx(
            s * math.log(2) + math.log1p(eps**a) / (a - 1), rel=1e-12
        )


@pytest.mark.parametrize(
    ("mechanism", "kw", "form", "expected"),
    [
        ("laplace", {"epsilon": 1.0}, "paper", 3.3),
        ("laplace", {"epsilon": 1.0}, "corrected", 5.19),
        ("gaussian", {"sigma": 1.0}, "paper", 2.3),
        ("gaussian", {"sigma": 1.0}, "corrected", 2.53),
    ],
)
def test_crossing_alphas_match_math_md(mechanism, kw, form, expected):
    a_star = lin_renyi_crossing_alpha(mechanism, form=form, **kw)
    print(
        f"crossing alpha {mechanism} {kw} {form}: {a_star:.6f} (docs/theory/mechanisms.md ~{expected})"
    )
    assert a_star == pytest.approx(
        expected, abs=0.1
    )  # docs/theory/mechanisms.md reads them off a plot / to 2 decimals
    # Independent side of the crossing: the Renyi-DP by quadrature straddles the bound at a* -+ 1e-3.
    scale = kw.get("epsilon", kw.get("sigma"))
    bound = (
        laplace_lin_renyi_upper_bound if mechanism == "laplace" else gaussian_lin_renyi_upper_bound
    )
    for a, sign in ((a_star - 1e-3, 1.0), (a_star + 1e-3, -1.0)):
        gap = bound(a, scale, form=form) - quad_renyi_1d(mechanism, a, scale, 1.0)
        assert sign * gap > 0


def test_crossing_raises_without_a_crossing():
    # eps = 0.1: the corrected bound tends to log 2 > Renyi-DP ~ 0.1 as alpha grows: no crossing.
    with pytest.raises(InvalidParameterError, match="hi"):
        lin_renyi_crossing_alpha("laplace", epsilon=0.1)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        lin_renyi_crossing_alpha("laplace", sigma=1.0)
    with pytest.raises(InvalidParameterError, match="sigma"):
        lin_renyi_crossing_alpha("gaussian", epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="mechanism"):
        lin_renyi_crossing_alpha("cauchy", epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="lo"):
        lin_renyi_crossing_alpha("laplace", epsilon=1.0, lo=1.5)


# --------------------------------------------------------------------------------------------------
# Pinsker and generalization
# --------------------------------------------------------------------------------------------------


def test_pinsker_and_generalization_values():
    assert pinsker_ipm_bound(0.25) == pytest.approx(4.0, rel=1e-15)  # 8 sqrt(1/4)
    assert generalization_gap_bound(0.01) == pytest.approx(0.8, rel=1e-15)  # 8 sqrt(1/100)
    assert classical_pinsker_tv_bound(0.5) == pytest.approx(0.5, rel=1e-15)  # sqrt(1/4)
    assert classical_pinsker_ipm_bound(0.5) == pytest.approx(1.0, rel=1e-15)  # sqrt(1)
    assert pinsker_ipm_bound(INF) == INF
    for fn in (pinsker_ipm_bound, classical_pinsker_tv_bound, classical_pinsker_ipm_bound):
        with pytest.raises(InvalidParameterError):
            fn(-0.1)
        with pytest.raises(InvalidParameterError):
            fn(math.nan)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        generalization_gap_bound(-1.0)


@pytest.mark.parametrize(
    ("mechanism", "scale"), [("laplace", 0.3), ("laplace", 2.0), ("gaussian", 1.0)]
)
def test_classical_pinsker_holds_for_quadrature_tv_and_kl(mechanism, scale):
    # Pinsker on independently integrated TV and KL; IPM over [-1, 1]-valued h is 2 TV.
    tv = quad_tv_1d(mechanism, scale, 1.0)
    kl = quad_kl_1d(mechanism, scale, 1.0)
    assert tv <= classical_pinsker_tv_bound(kl)
    assert 2 * tv <= classical_pinsker_ipm_bound(kl)
    assert classical_pinsker_ipm_bound(kl) <= pinsker_ipm_bound(kl)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "x"])
def test_bad_epsilon_and_sigma_rejected(bad):
    for fn in (laplace_kl, laplace_lin_kl, laplace_tv, laplace_chi2, laplace_hellinger):
        with pytest.raises(InvalidParameterError, match="epsilon"):
            fn(bad)
    for fn in (gaussian_kl, gaussian_lin_kl, gaussian_tv, gaussian_chi2, gaussian_hellinger):
        with pytest.raises(InvalidParameterError, match="sigma"):
            fn(bad)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        laplace_renyi(2.0, bad)
    with pytest.raises(InvalidParameterError, match="sigma"):
        gaussian_renyi(2.0, bad)


@pytest.mark.parametrize("bad", [0.5, -3.0, math.nan])
def test_bad_alpha_rejected(bad):
    for fn in (laplace_renyi, gaussian_renyi, laplace_renyi_lower_bound):
        with pytest.raises(InvalidParameterError, match="alpha"):
            fn(bad, 1.0)


def test_alpha_one_points_to_kl():
    with pytest.raises(InvalidParameterError, match="alpha.*KL"):
        laplace_renyi(1.0, 1.0)
    with pytest.raises(InvalidParameterError, match="alpha.*KL"):
        gaussian_renyi(1.0, 1.0)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 1.999])
def test_upper_bounds_need_alpha_at_least_two(alpha):
    for fn in (
        laplace_lin_renyi_upper_bound,
        gaussian_lin_renyi_upper_bound,
        lambda a, e: matrix_mechanism_lin_renyi_upper_bound(a, e, 2),
    ):
        with pytest.raises(InvalidParameterError, match="alpha") as info:
            fn(alpha, 1.0)
        if alpha > 1.0:
            assert ">= 2" in str(info.value)


def test_bad_form_sensitivity_and_rows_rejected():
    with pytest.raises(InvalidParameterError, match="form"):
        laplace_lin_renyi_upper_bound(2.0, 1.0, form="printed")
    with pytest.raises(InvalidParameterError, match="form"):
        gaussian_lin_renyi_upper_bound(2.0, 1.0, form="")
    with pytest.raises(InvalidParameterError, match="form"):
        matrix_mechanism_lin_renyi_upper_bound(2.0, 1.0, 3, form="tight")
    with pytest.raises(InvalidParameterError, match="strategy_rows"):
        matrix_mechanism_lin_renyi_upper_bound(2.0, 1.0, 0)
    with pytest.raises(InvalidParameterError, match="strategy_rows"):
        matrix_mechanism_lin_renyi_upper_bound(2.0, 1.0, 2.5)
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        laplace_kl(1.0, [1.0, math.nan])
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        gaussian_kl(1.0, [])
