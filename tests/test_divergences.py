"""Divergence conjugates and objectives against independent computations."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, optimize

from cbdp_jax import InvalidParameterError
from cbdp_jax.divergences import (
    alpha_from_renyi,
    alpha_optimal_scale,
    donsker_varadhan,
    get_divergence,
    kl_optimal_shift,
    renyi_from_alpha,
    renyi_scale_free,
    variational_objective,
)

FINITE_CONJ = ["kl", "hellinger", "chi2", "js"]


@pytest.mark.x64
@pytest.mark.parametrize("name", FINITE_CONJ + ["tv"])
@pytest.mark.parametrize("s", [-2.0, -0.4, 0.0, 0.3, 0.6])
def test_conjugate_matches_numerical_sup(name, s):
    """f*(s) = sup_t (t s - f(t)), computed independently with scipy over t >= 0 (t on R for tv/chi2)."""
    div = get_divergence(name)
    f = lambda t: float(div.f(jnp.asarray(t)))  # noqa: E731
    sup = float(div.conjugate_sup)
    value = float(div.conjugate(jnp.asarray(s)))
    if s > sup or (name == "tv" and abs(s) > 0.5):
        assert value == math.inf
        return
    lo = -50.0 if name in ("tv", "chi2") else 0.0
    res = optimize.minimize_scalar(
        lambda t: -(t * s - f(t)), bounds=(lo, 60.0), method="bounded", options={"xatol": 1e-12}
    )
    # Bounded scalar search converges to 1e-8 in the objective for these smooth concave problems.
    assert value == pytest.approx(-res.fun, abs=1e-6)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0, 10.0])
@pytest.mark.parametrize("s", [-1.3, -0.2, 0.0, 0.7, 2.5])
def test_alpha_conjugates_both_conventions(alpha, s):
    for convention, lo in (("abs", -80.0), ("nonneg", 0.0)):
        div = get_divergence("alpha", alpha=alpha, convention=convention)
        f = lambda t: (abs(t) ** alpha - 1) / (alpha**2 - alpha)  # noqa: E731
        res = optimize.minimize_scalar(
            lambda t: -(t * s - f(t)), bounds=(lo, 80.0), method="bounded", options={"xatol": 1e-12}
        )
        assert float(div.conjugate(jnp.asarray(s))) == pytest.approx(-res.fun, rel=1e-6, abs=1e-8)


@pytest.mark.x64
def test_renyi_map_roundtrip_and_monotone():
    v = jnp.linspace(-0.02, 3.0, 50)  # alpha(alpha-1)v > -1 for every alpha below
    for a in (1.5, 2.0, 7.0):
        r = renyi_from_alpha(v, a)
        assert bool(jnp.all(jnp.diff(r) > 0))
        np.testing.assert_allclose(alpha_from_renyi(r, a), v, rtol=1e-10, atol=1e-12)
    assert float(renyi_from_alpha(-1.0, 2.0)) == -math.inf
    assert float(renyi_from_alpha(jnp.inf, 2.0)) == math.inf


@pytest.mark.x64
def test_dv_equals_kl_fform_at_optimal_shift():
    rng = np.random.default_rng(0)
    hp, hq = rng.normal(size=1000), rng.normal(0.3, 1.2, size=800)
    div = get_divergence("kl")
    c = kl_optimal_shift(hq)
    np.testing.assert_allclose(
        variational_objective(div, hp + c, hq + c), donsker_varadhan(hp, hq), rtol=1e-12
    )
    # and any other shift is worse (concavity in c)
    for dc in (-0.3, 0.2):
        assert variational_objective(div, hp + c + dc, hq + c + dc) < donsker_varadhan(hp, hq)


@pytest.mark.x64
@pytest.mark.parametrize("convention", ["abs", "nonneg"])
@pytest.mark.parametrize("alpha", [1.7, 4.0])
def test_scale_free_renyi_equals_fform_at_optimal_scale(alpha, convention):
    rng = np.random.default_rng(1)
    hp, hq = rng.normal(0.5, 1.0, size=500), rng.normal(-0.2, 1.0, size=700)
    div = get_divergence("renyi", alpha=alpha, convention=convention)
    t = alpha_optimal_scale(hp, hq, alpha, convention)
    fform = variational_objective(div, t * hp, t * hq)
    np.testing.assert_allclose(
        div.to_reported(fform), renyi_scale_free(hp, hq, alpha, convention), rtol=1e-10
    )
    for dt in (0.8, 1.25):
        assert variational_objective(div, dt * t * hp, dt * t * hq) < fform


def test_scale_free_renyi_at_density_ratio_is_renyi():
    """For h = (p/q)^(alpha-1) both expectations equal int p^a q^(1-a) (docs/theory/objectives.md check)."""
    alpha, eps = 3.0, 1.0
    p = lambda x: 0.5 * eps * np.exp(-eps * abs(x))  # noqa: E731
    q = lambda x: 0.5 * eps * np.exp(-eps * abs(x - 1))  # noqa: E731
    # (p/q)^(alpha-1) in log space: the densities themselves underflow in the far tails.
    h = lambda x: math.exp((alpha - 1) * eps * (abs(x - 1) - abs(x)))  # noqa: E731
    e_p = sum(
        integrate.quad(lambda x: p(x) * h(x), a, b)[0]
        for a, b in ((-np.inf, 0), (0, 1), (1, np.inf))
    )
    a_exp = alpha / (alpha - 1)
    e_q = sum(
        integrate.quad(lambda x: q(x) * abs(h(x)) ** a_exp, a, b)[0]
        for a, b in ((-np.inf, 0), (0, 1), (1, np.inf))
    )
    value = a_exp * math.log(e_p) - math.log(e_q)
    renyi_dp = math.log(
        (0.5 + 1 / (4 * alpha - 2)) * math.exp((alpha - 1) * eps)
        + (0.5 - 1 / (4 * alpha - 2)) * math.exp(-alpha * eps)
    ) / (alpha - 1)
    assert value == pytest.approx(renyi_dp, rel=1e-8)


def test_float32_objectives_do_not_overflow_to_nan():
    hq = jnp.asarray([100.0, 200.0, -5.0], dtype=jnp.float32)
    hp = jnp.asarray([1.0, 2.0], dtype=jnp.float32)
    dv = donsker_varadhan(hp, hq)
    # log mean exp = 200 - log 3 + log(1 + e^-100 + ...): exact to float32 precision.
    assert np.isfinite(float(dv))
    assert float(dv) == pytest.approx(1.5 - (200 - math.log(3)), rel=1e-6)
    assert np.isfinite(float(renyi_scale_free(hp, hq * 100, 50.0)))
    assert float(variational_objective(get_divergence("kl"), hp, hq)) == -math.inf


@pytest.mark.parametrize("alpha", [1.0, 0.5, -2, float("nan"), None])
def test_bad_alpha_is_rejected_with_a_named_parameter(alpha):
    with pytest.raises(InvalidParameterError, match="alpha"):
        get_divergence("renyi", alpha=alpha)


def test_alpha_one_message_points_to_kl():
    with pytest.raises(InvalidParameterError, match="KL"):
        get_divergence("renyi", alpha=1.0)


def test_unknown_divergence_lists_choices():
    with pytest.raises(InvalidParameterError, match="'kl'"):
        get_divergence("wasserstein")
