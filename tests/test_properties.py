"""Property tests (hypothesis): orderings, symmetry and invariances the paper's definitions imply.

Exact layer (quadrature + concave solver, float64). Every reported value is the plain f-form of one
function h of the class (ExactResult docs), so it can exceed the unrestricted divergence only by
quadrature error (~1e-12 relative): 1e-9 relative is allowed. Nesting and symmetry compare two solver
optima, each met to a relative Newton decrement of 1e-10 (value error ~1e-20) on quadrature accurate to
~1e-12: 1e-8 relative is allowed, and only converged results are compared (a result flagged
``converged=False`` says its value is unreliable).

Estimator (float64). Statements about a held-out lower confidence bound hold with probability >= its
level for a correct estimator; the examples are derandomized (fixed), so each test is deterministic, and
the level is raised where a false failure would otherwise be likely (stated per test).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cbdp_jax import exact
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples

EXACT_SETTINGS = settings(
    deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
EST_SETTINGS = settings(
    deadline=None,
    max_examples=6,
    suppress_health_check=[HealthCheck.too_slow],
)

# epsilon in [0.01, 20] and sigma in [0.05, 50], drawn log-uniformly
log_eps = st.floats(math.log(0.01), math.log(20.0))
log_sigma = st.floats(math.log(0.05), math.log(50.0))
alphas = st.floats(math.log(1.01 - 1.0), math.log(100.0 - 1.0)).map(lambda t: 1.0 + math.exp(t))


@st.composite
def noise_pairs(draw):
    family = draw(st.sampled_from(["laplace", "gaussian"]))
    if family == "laplace":
        eps = math.exp(draw(log_eps))
        return family, eps, exact.laplace_pair(eps)
    sigma = math.exp(draw(log_sigma))
    return family, sigma, exact.gaussian_pair(sigma)


@st.composite
def divergences(draw):
    name = draw(st.sampled_from(["kl", "renyi"]))
    return name, (draw(alphas) if name == "renyi" else None)


def closed_form(family: str, par: float, name: str, alpha: float | None) -> float:
    """Unrestricted divergence of the unit-shift pair, typed from docs/theory/mechanisms.md (log space)."""
    if family == "gaussian":
        return (alpha if name == "renyi" else 1.0) / (2.0 * par * par)
    if name == "kl":
        return par + math.expm1(-par)
    c = 1.0 / (4.0 * alpha - 2.0)
    s = np.logaddexp(math.log(0.5 + c) + (alpha - 1.0) * par, math.log(0.5 - c) - alpha * par)
    return float(s) / (alpha - 1.0)


CLASSES = [("linear", 1), ("poly", 2), ("poly", 3)]


@EXACT_SETTINGS
@given(pair=noise_pairs(), div=divergences(), cls=st.sampled_from(CLASSES))
def test_exact_restricted_never_exceeds_unrestricted(pair, div, cls):
    family, par, p = pair
    name, alpha = div
    r = exact.restricted_divergence(p, name, cls[0], degree=cls[1], alpha=alpha)
    u = exact.unrestricted_divergence(p, name, alpha=alpha)
    ref = closed_form(family, par, name, alpha)
    assert not math.isnan(r.value)
    assert u.value == pytest.approx(ref, rel=1e-7)  # quadrature vs closed form
    assert r.value <= ref * (1.0 + 1e-9) + 1e-15, (r.value, ref, r.converged, r.reason)
    assert r.value >= -1e-12  # constants are in every class: D^H >= 0


@EXACT_SETTINGS
@given(pair=noise_pairs(), div=divergences())
def test_exact_classes_nest_linear_poly2_poly3(pair, div):
    _, _, p = pair
    name, alpha = div
    lin, p2, p3 = (
        exact.restricted_divergence(p, name, adv, degree=k, alpha=alpha) for adv, k in CLASSES
    )
    assume(lin.converged and p2.converged and p3.converged)
    tol = 1e-8 * abs(p3.value) + 1e-14
    assert lin.value <= p2.value + tol, (lin.value, p2.value)
    assert p2.value <= p3.value + tol, (p2.value, p3.value)


@EXACT_SETTINGS
@given(
    pair=noise_pairs(),
    div=divergences(),
    cls=st.sampled_from(CLASSES),
    shift=st.floats(0.1, 3.0),
)
# Regression: this example failed once on a fresh clone with the monomial-basis solver (2.1778516440e-06
# vs 2.1778516221e-06, rel 1e-8). The tolerance is right (1e-8 is 100x inside the exact layer's 1e-6
# promise, and the abs part covers float64 cancellation of the O(1) terms) and the solver was not: the
# monomial Hessian is ill-conditioned at eps = 0.027 (coefficients on scales 1 to 1e6 for noise scale
# 37). The orthonormal-basis solver (docs/theory/exact_solver.md) gives 2.1773328454e-06 both ways (rel
# 2e-13), certified by its Newton decrement and attained by its h (scipy quadrature of the f-form, rel
# 4e-8); the old uncertified values sat 2.4e-4 above it.
@example(
    pair=("laplace", 0.02696, exact.laplace_pair(0.02696)),
    div=("renyi", 1.02707),
    cls=("poly", 3),
    shift=0.1,
)
def test_exact_symmetric_pairs_give_the_same_value_both_ways(pair, div, cls, shift):
    # D(Q, P) with P = F(0), Q = F(v) equals, after translating by -v, D(F(0), F(-v)): the pair with the
    # negated shift. Symmetric noise (Laplace, Gaussian) and classes closed under x -> -x make it equal
    # to D(P, Q) although KL and Renyi are not symmetric divergences.
    family, par, _ = pair
    make = exact.laplace_pair if family == "laplace" else exact.gaussian_pair
    name, alpha = div
    fwd = exact.restricted_divergence(make(par, shift), name, cls[0], degree=cls[1], alpha=alpha)
    rev = exact.restricted_divergence(make(par, -shift), name, cls[0], degree=cls[1], alpha=alpha)
    assume(fwd.converged and rev.converged)
    # The solver sees a mirrored geometry (kinks at 0 and -v, mirrored roots), so this is not a
    # tautology of the implementation.
    assert rev.value == pytest.approx(fwd.value, rel=1e-8, abs=1e-14)


# --------------------------------------------------------------------------------------------------
# The estimator
# --------------------------------------------------------------------------------------------------


# The estimator tests compare runs to 1e-8 or rely on float64 sums: they run with x64 on (marker), and
# their configs are built inside the test, where x64 is on.
def _config(**changes) -> EstimatorConfig:
    fields = dict(steps=200, eval_every=20, ensemble=2, batch_size=1024, dtype="float64")
    return EstimatorConfig(**{**fields, **changes})


N = 4000


def _draw(family: str, scale: float, rng: np.random.Generator, shift: float, n: int = N):
    if family == "laplace":
        return rng.laplace(shift, scale, n)
    return rng.normal(shift, scale, n)


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.x64
@EST_SETTINGS
@given(
    family=st.sampled_from(["laplace", "gaussian"]),
    scale=st.floats(0.2, 5.0),
    div=st.sampled_from([("kl", None), ("renyi", 4.0)]),
    seed=st.integers(0, 2**16),
)
def test_estimator_bound_covers_zero_when_p_equals_q(family, scale, div, seed):
    # P = Q: every divergence is 0, and a held-out f-form of any fixed h has expectation <= 0. The
    # f-scale bound at level 0.999 exceeds 0 with probability <= 0.1% for a correct estimator.
    rng = np.random.default_rng(seed)
    p, q = _draw(family, scale, rng, 0.0), _draw(family, scale, rng, 0.0)
    cfg = _config(confidence=0.999)
    res = estimate_from_samples(
        jax.random.key(seed), p, q, adversary="linear", divergence=div[0], alpha=div[1], config=cfg
    )
    assert res.f_lower_bound <= 0.0, (res.f_estimate, res.f_std_error, res.warnings)
    assert res.lower_bound == 0.0  # the reported bound is the f-scale bound clamped at 0


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.x64
@EST_SETTINGS
@given(
    a=st.floats(math.log(0.01), math.log(100.0)).map(math.exp),
    b=st.floats(-100.0, 100.0),
    div=st.sampled_from([("kl", None), ("renyi", 4.0)]),
    seed=st.integers(0, 2**16),
)
def test_linear_estimate_invariant_under_increasing_affine_reparametrisation(a, b, div, seed):
    # x -> a x + b (a > 0) for both samples. The estimator standardises inputs with the pooled mean and
    # standard deviation, which absorb (a, b): the standardised inputs agree to ~1e-13 relative in
    # float64 (|b| / a <= 1e4), and with the same key the split, initialisation and minibatches are the
    # same, so the trained function and the held-out value agree up to rounding amplified over 200
    # Adam steps (measured ~1e-14). 1e-8 absolute is asserted; a class that is not closed under affine
    # maps, or a missing standardisation, moves the estimate by far more (the MC noise is ~0.03).
    rng = np.random.default_rng(seed)
    p, q = rng.laplace(0.0, 1.0, N), rng.laplace(1.0, 1.0, N)
    key = jax.random.key(seed)
    kw = dict(adversary="linear", divergence=div[0], alpha=div[1], config=_config())
    base = estimate_from_samples(key, p, q, **kw)
    moved = estimate_from_samples(key, a * p + b, a * q + b, **kw)
    assert moved.estimate == pytest.approx(base.estimate, abs=1e-8)
    assert moved.std_error == pytest.approx(base.std_error, abs=1e-8)


def _lbfgs_config() -> EstimatorConfig:
    return EstimatorConfig(steps=100, eval_every=20, ensemble=1, optimizer="lbfgs", dtype="float64")


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.x64
@EST_SETTINGS
@given(
    family=st.sampled_from(["laplace", "gaussian"]),
    a=st.floats(math.log(0.01), math.log(100.0)).map(lambda t: -math.exp(t)),
    b=st.floats(-100.0, 100.0),
    seed=st.integers(0, 2**16),
)
def test_linear_estimate_invariant_under_decreasing_affine_reparametrisation(family, a, b, seed):
    # a < 0 mirrors the standardised inputs, so the same initial parameters are a different (mirrored)
    # function and Adam's path differs: after 200 Adam steps two such runs were measured up to 3 SE
    # apart (optimisation gaps, not noise). With full-batch L-BFGS both runs reach the optimum of the same
    # concave training objective (mirrored parameters), evaluated on the same held-out samples. They can
    # still differ when validation-based selection keeps another member of H (e.g. the initial function,
    # if it scores as high on validation); such members are within validation noise of each other, so
    # their held-out values differ by about one SE at most (measured: 0 in 14 of 16 cases, <= 0.3 SE).
    # Allowed: 1 combined SE + 0.01. An unstandardised or non-negation-closed class fails by far more.
    rng = np.random.default_rng(seed)
    p, q = _draw(family, 1.0, rng, 0.0), _draw(family, 1.0, rng, 1.0)
    key = jax.random.key(seed)
    base = estimate_from_samples(key, p, q, adversary="linear", config=_lbfgs_config())
    moved = estimate_from_samples(
        key, a * p + b, a * q + b, adversary="linear", config=_lbfgs_config()
    )
    tol = math.hypot(base.std_error, moved.std_error) + 0.01
    assert abs(moved.estimate - base.estimate) <= tol, (base.estimate, moved.estimate, tol)


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.x64
@EST_SETTINGS
@given(
    family=st.sampled_from(["laplace", "gaussian"]),
    scale=st.floats(0.3, 4.0),
    div=st.sampled_from([("kl", None), ("renyi", 4.0)]),
    adversary=st.sampled_from([("linear", {}), ("poly", {"degree": 2})]),
    seed=st.integers(0, 2**16),
)
def test_estimated_lower_bound_never_exceeds_the_unrestricted_value(
    family, scale, div, adversary, seed
):
    # D^H <= D, and the bound is a 99% lower confidence bound on D^H: a correct estimator exceeds D
    # with probability <= 1% (much less where D^H < D strictly, e.g. every Laplace case).
    rng = np.random.default_rng(seed)
    p, q = _draw(family, scale, rng, 0.0), _draw(family, scale, rng, 1.0)
    cfg = _config(confidence=0.99)
    res = estimate_from_samples(
        jax.random.key(seed),
        p,
        q,
        adversary=adversary[0],
        divergence=div[0],
        alpha=div[1],
        config=cfg,
        **adversary[1],
    )
    par = 1.0 / scale if family == "laplace" else scale
    truth = closed_form(family, par, div[0], div[1])
    assert not math.isnan(res.lower_bound)
    assert res.lower_bound <= truth, (res.lower_bound, res.estimate, truth, res.warnings)


@pytest.mark.x64
@settings(deadline=None, max_examples=4)
@given(
    family=st.sampled_from(["laplace", "gaussian"]),
    scale=st.floats(0.75, 2.0),
    seed=st.integers(0, 2**16),
)
def test_estimator_symmetric_pair_same_value_both_directions(family, scale, seed):
    # D(P, Q) = D(Q, P) for a shift pair of symmetric noise (see the exact test). both_directions
    # estimates each on the same split with the roles swapped; the estimates differ by sampling noise
    # and two optimisation gaps: 4 combined SE (a correct estimator leaves the band with probability
    # < 1e-4) plus 0.01 for optimisation. Laplace scale >= 0.75 (eps <= 4/3): beyond it the linear KL
    # term exp(h) under Q has infinite variance (docs/theory/bounds.md, "Heavy tails"), the standard
    # errors do not describe the spread and no SE band holds (scale 0.5, seed 56: 0.86 against 0.41,
    # band 0.24, the forward bound refused for its tail).
    rng = np.random.default_rng(seed)
    p, q = _draw(family, scale, rng, 0.0), _draw(family, scale, rng, 1.0)
    cfg = _config(both_directions=True)
    res = estimate_from_samples(jax.random.key(seed), p, q, adversary="linear", config=cfg)
    back = res.reverse
    assert back is not None and back.direction == "QP"
    band = 4.0 * math.hypot(res.std_error, back.std_error) + 0.01
    assert abs(res.estimate - back.estimate) <= band, (res.estimate, back.estimate, band)
