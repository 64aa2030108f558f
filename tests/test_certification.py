"""What an estimate certifies: guarantees, refusals, the sample-size ceiling, no +inf from samples.

Single-key assertions below never rest on a 95% bound happening to fall below the truth: either the
assertion is about a deterministic property (a bound is refused, a ceiling computed from n alone is
below the truth), or it is repeated over keys.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from cbdp_jax import exact
from cbdp_jax._src.estimator import certification, certification_choice, certification_support
from cbdp_jax._src.privacy.divergences import get_divergence
from cbdp_jax._src.statistics import held_out
from cbdp_jax.estimator import EstimatorConfig, estimate, estimate_from_samples
from cbdp_jax.mechanisms import LaplaceMechanism, NonPrivateRelease, RandomizedResponse

FAST = EstimatorConfig(steps=300, eval_every=50, ensemble=2, batch_size=1024)


@pytest.mark.parametrize("guarantee", ["asymptotic", "finite-sample"])
def test_three_samples_give_a_finite_bound_and_say_how_little_they_can_certify(guarantee):
    res = estimate(
        jax.random.key(0),
        LaplaceMechanism(epsilon=1.0),
        samples=3,
        test_samples=3,
        adversary="linear",
        config=EstimatorConfig(steps=50, ensemble=1, batch_size=None, guarantee=guarantee),
    )
    assert not res.unbounded
    assert math.isfinite(res.lower_bound) and res.lower_bound == 0.0
    # 3 paired samples cannot certify any positive KL (the ceiling is computed from n alone).
    assert res.certifiable_max <= 0.0
    # Both guarantees say so in the same words (deterministic: the ceiling depends on n alone); the
    # asymptotic bound is also refused (3 samples cannot show a tail index above 3).
    assert any(w.startswith("3 samples per side can certify at most -0.3686") for w in res.warnings)
    assert res.bound_reliable is (guarantee == "finite-sample")


@pytest.mark.slow
@pytest.mark.ci
def test_randomized_response_at_eps_12_is_finite_and_below_the_truth():
    # KL(RR(0) || RR(1)) = (p - q) eps = 11.9999 for k = 2; 1e5 samples per side can certify at most
    # about log(1e5) - 1.8 = 9.7 with ANY bounded critic, so every finite-sample bound is below it.
    rr = RandomizedResponse(epsilon=12.0, k=2)
    truth = (2 * rr.p_true - 1) * 12.0
    for guarantee in ("finite-sample", "asymptotic"):
        res = estimate(
            jax.random.key(1),
            rr,
            samples=100_000,
            adversary="linear",
            config=EstimatorConfig(steps=300, ensemble=1, batch_size=4096, guarantee=guarantee),
        )
        assert not res.unbounded and math.isfinite(res.lower_bound)
        assert res.certifiable_max < truth
        assert res.lower_bound <= res.certifiable_max < truth
        if guarantee == "finite-sample":
            assert res.bound_reliable and res.guarantee == "finite-sample"


@pytest.mark.slow
@pytest.mark.ci
def test_two_points_against_one_is_not_infinite_for_the_linear_class():
    # P = (delta_0 + delta_2) / 2, Q = delta_1: every linear h has E_P h = E_Q h, so KL^lin = 0,
    # although the supports are disjoint (the unrestricted KL is +inf). Samples must not say +inf.
    rng = np.random.default_rng(2)
    p = 2.0 * rng.integers(0, 2, 20_000)
    q = np.ones(20_000)
    res = estimate_from_samples(jax.random.key(2), p, q, adversary="linear", config=FAST)
    assert not res.unbounded and math.isfinite(res.estimate)
    # KL^lin = 0 exactly: the estimate is within 4 SE of it (plus float32 rounding), the bound trivial.
    assert abs(res.estimate) <= 4 * res.std_error + 1e-4 and res.lower_bound == 0.0


def test_a_non_private_release_is_infinite_from_its_law_but_finite_for_a_bounded_class():
    cfg = EstimatorConfig(steps=100, ensemble=1)
    inf = estimate(
        jax.random.key(3), NonPrivateRelease(dim=1), samples=1000, adversary="linear", config=cfg
    )
    assert inf.unbounded and inf.lower_bound == math.inf and inf.guarantee == "exact"
    bounded = estimate(
        jax.random.key(3),
        NonPrivateRelease(dim=1),
        samples=1000,
        adversary="linear",
        bound=2.0,
        config=cfg,
    )
    # A bounded class has a finite divergence: B - f*(-B) at most for KL.
    assert not bounded.unbounded and bounded.estimate <= 2.0 + 1e-6
    assert bounded.guarantee == "finite-sample"


@pytest.mark.slow
@pytest.mark.ci
def test_laplace_eps2_linear_kl_heavy_tail_is_shrunk_and_a_light_one_is_not():
    # At eps = 2 the optimal slope gives exp(h) under Q the tail index 1.618 < 2 (infinite variance):
    # the asymptotic bound must come from a shrunken member (t < 1) or be refused, in every run.
    for seed in range(3):
        res = estimate(
            jax.random.key(10 + seed),
            LaplaceMechanism(epsilon=2.0),
            samples=50_000,
            adversary="linear",
            config=EstimatorConfig(steps=400, ensemble=2, batch_size=2048, guarantee="asymptotic"),
        )
        assert res.tail_shrink < 1.0 or not res.bound_reliable
        if res.bound_reliable:
            assert res.tail_index_q > 2.0
    # Negative control: eps = 0.25 (tail index 8.1) needs no shrink.
    light = estimate(
        jax.random.key(20),
        LaplaceMechanism(epsilon=0.25),
        samples=50_000,
        adversary="linear",
        config=EstimatorConfig(steps=400, ensemble=2, batch_size=2048, guarantee="asymptotic"),
    )
    assert light.tail_shrink == 1.0 and light.bound_reliable


def _shrink_problem(rng, eps: float, slope: float, n: int = 8192):
    """Raw linear-critic outputs h = slope * x on Laplace validation / fit samples (P at 1, Q at 0)."""
    h_p = slope * rng.laplace(1.0, 1.0 / eps, n)
    h_q = slope * rng.laplace(0.0, 1.0 / eps, n)
    h_fit = slope * rng.laplace(0.0, 1.0 / eps, n)
    return h_p, h_q, h_fit


@pytest.mark.parametrize("divergence, alpha, kind", [("kl", None, "dv"), ("renyi", 2.0, "fform")])
def test_traced_shrink_picks_what_the_host_shrink_picks(divergence, alpha, kind):
    # The sweep shrinks inside its compiled program, the estimator on the host: one rule, two
    # implementations, which must choose the same member on continuous samples. 12 problems with tail
    # indices eps / slope from 1.1 to 6 (shrinks from 1 to ~0.3); the chosen t must agree exactly (same
    # grid) and the scale / constant to float32 rounding.
    div = get_divergence(divergence, alpha=alpha)
    need = certification.tail_target(100_000, 0.0)
    rng = np.random.default_rng(0)
    traced = jax.jit(
        lambda hp, hq, hf: certification.shrink_for_tails_traced(
            div, alpha, kind, h_val_p=hp, h_val_q=hq, h_fit_q=hf, scale=1.0, shift=0.0, need=need
        )
    )
    shrinks = []
    for eps, slope in [
        (1.0, 0.4142),
        (2.0, 0.236),
        (3.0, 0.5),
        (0.5, 0.1),
        (1.0, 0.9),
        (2.0, 1.8),
    ] * 2:
        h_p, h_q, h_fit = _shrink_problem(rng, eps, slope)
        host = certification.shrink_for_tails(
            div, kind, h_val_p=h_p, h_val_q=h_q, h_fit_q=h_fit, scale=1.0, shift=0.0, need=need
        )
        f32 = [np.asarray(a, np.float32) for a in (h_p, h_q, h_fit)]
        got = [float(v) for v in traced(*f32)]
        assert got[2] == pytest.approx(host[2], rel=1e-6), (eps, slope, host, got)
        np.testing.assert_allclose(got[:2], host[:2], rtol=1e-4, atol=1e-5)
        shrinks.append(host[2])
    # KL's exponential conjugate: the problems exercise both branches, no shrink and a strong one.
    # (A power conjugate keeps the tail index of h under scaling, so Renyi's check is all or nothing.)
    assert max(shrinks) == 1.0
    if kind == "dv":
        assert min(shrinks) < 0.6
    else:
        assert set(shrinks) == {1.0}


def test_traced_shrink_refuses_to_move_when_no_member_clears_the_check():
    # Negative control: an unreachable index (1e6) leaves the critic as it was, t = 1, as on the host.
    div = get_divergence("kl")
    h_p, h_q, h_fit = _shrink_problem(np.random.default_rng(1), 2.0, 1.0)
    s, c, t = certification.shrink_for_tails_traced(
        div, None, "dv", h_val_p=h_p, h_val_q=h_q, h_fit_q=h_fit, scale=1.0, shift=0.25, need=1e6
    )
    assert (float(s), float(c), float(t)) == (1.0, 0.25, 1.0)


@pytest.mark.slow
@pytest.mark.ci
def test_results_say_which_guarantee_and_what_they_bound():
    res = estimate(
        jax.random.key(4),
        LaplaceMechanism(epsilon=1.0),
        samples=20_000,
        adversary="linear",
        config=EstimatorConfig(
            steps=200, ensemble=1, batch_size=1024, guarantee="finite-sample", confidence=0.999
        ),
    )
    d = res.to_dict()
    assert d["guarantee"] == "finite-sample" and d["bound_method"] in ("berry-esseen", "betting")
    assert "tanh(linear" in d["certified_class"] and d["critic_bound"] > 0
    assert d["bounds"].startswith("KL^H(P||Q) for H = ") and "hence KL(P||Q)" in d["bounds"]
    # B tanh(linear / B) is not inside the linear class: the result must say so.
    assert d["bound_on_named_class"] is False and d["named_class"] == "linear"
    assert "not a bound on KL^H for H = linear" in d["bounds"]
    # The bound is on B tanh(linear / B), hence below the unrestricted KL eps - 1 + e^-eps = 0.367879
    # (at level 0.999: a correct bound exceeds it with probability <= 0.1%).
    assert res.bound_reliable and 0.0 < res.lower_bound <= 0.367879


def test_sequential_mode_stops_early_when_the_target_is_easy_and_spends_the_budget_otherwise():
    mech = LaplaceMechanism(epsilon=1.0)
    cfg = dict(steps=200, ensemble=1, batch_size=1024, eval_chunk=4096)
    easy = estimate(
        jax.random.key(5),
        mech,
        samples=20_000,
        test_samples=200_000,
        adversary="linear",
        config=EstimatorConfig(**cfg, target=0.05),
    )
    assert easy.bound_method == "betting-sequence" and easy.lower_bound >= 0.05
    assert easy.samples["test_p"] < 200_000
    hard = estimate(
        jax.random.key(5),
        mech,
        samples=20_000,
        test_samples=40_000,
        adversary="linear",
        config=EstimatorConfig(**cfg, target=5.0),
    )
    assert hard.samples["test_p"] == 40_000 and hard.lower_bound < 5.0


def test_support_of_a_bounded_critic_contains_every_possible_difference():
    for div in (get_divergence("kl"), get_divergence("renyi", alpha=4.0), get_divergence("chi2")):
        lo, hi = certification.support(div, 2.5)
        s = np.linspace(-2.5, 2.5, 2001)
        f = np.asarray(div.conjugate(s), np.float64)
        diffs = s[:, None] - f[None, :]
        assert lo <= diffs.min() and diffs.max() <= hi
        # and is not loose: the extremes are attained at the grid's ends / the conjugate's minimum, up
        # to the float32 rounding allowance (certification.rounding_slack) and the secant slack of
        # the conjugate.
        fmin, fmax = certification.conjugate_range(div, -2.5, 2.5)
        slack = certification.rounding_slack(div, -2.5, 2.5, fmin, fmax)
        assert 0 < slack < 1e-3
        # (diffs are float32 values: their own rounding, a few 1e-7 relative, is allowed too)
        assert diffs.min() - lo <= slack + 1e-6 * (1 + abs(lo)) and hi - diffs.max() < 1e-3
        # float32 differences of saturated critics stay inside (the case that once left the support).
        top = np.float32(2.5) - np.asarray(div.conjugate(np.float32(-2.5)), np.float32)
        assert float(top) <= hi


def test_exact_linear_value_is_a_fixed_reference_for_the_coverage_benchmark():
    # The coverage benchmark compares bounds with these exact values; pin them (docs/theory/bounds.md).
    v = exact.restricted_divergence(exact.laplace_pair(2.0), "kl", "linear").value
    a = math.sqrt(5.0) - 1.0  # optimal slope sqrt(eps^2 + 1) - 1 at eps = 2
    assert 2.0 / a == pytest.approx(1.618, abs=1e-3)  # the tail index eps / a* of exp(h) under Q
    # Independent closed form: the DV value of the optimal slope, a + log(1 - a^2 / eps^2).
    assert v == pytest.approx(a + math.log(1.0 - a * a / 4.0), abs=1e-9)


@pytest.mark.slow
@pytest.mark.ci
def test_kl_conservative_fit_matches_scoring_every_candidate():
    """The KL refit scores its 41 constants c - k/4 from one pass (f* = exp(s - 1) scales by
    exp(-d)); it must pick the constant a direct float64 evaluation of every candidate picks, on
    light- and heavy-tailed validation outputs (the heavy ones move the choice away from k = 0)."""
    import jax.numpy as jnp

    from cbdp_jax._src.estimator.objectives import (
        CONSERVATIVE_CANDIDATES,
        conservative_fit,
        objective_functions,
    )

    conj = objective_functions("dv", "kl", "abs").conjugate
    rng = np.random.default_rng(3)
    chosen = set()
    for trial in range(40):
        n = int(rng.integers(200, 5000))
        slope = rng.uniform(0.05, 1.5)  # tail index of exp(h) under Q is 1 / slope
        h_p = rng.laplace(1.0, 1.0, n) * slope
        h_q = rng.laplace(0.0, 1.0, n) * slope
        shift = rng.normal()
        _, got = conservative_fit("dv", conj, jnp.asarray(h_p), jnp.asarray(h_q), 1.0, shift, 1.645)
        # Direct evaluation of every candidate, in float64 numpy.
        cands = shift - 0.25 * np.arange(CONSERVATIVE_CANDIDATES)
        lcbs = []
        for c in cands:
            a, b = h_p + c, np.exp(h_q + c - 1.0)
            se = np.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
            lcbs.append(a.mean() - b.mean() - 1.645 * se)
        lcbs = np.asarray(lcbs)
        k_got = int(round((shift - float(got)) / 0.25))
        # The same choice, or a tie within float32 rounding of the bounds.
        assert lcbs[k_got] >= lcbs.max() - 1e-5 * (1.0 + abs(lcbs.max())), trial
        chosen.add(k_got)
    assert len(chosen) > 1  # the data exercised more than the closed-form point


def test_conservative_fit_shrinks_a_heavy_tailed_scale_and_keeps_a_light_one():
    # Validation outputs h of a Renyi-4 critic: under Q a Pareto(1.2) tail makes |h|^(4/3) heavy, so
    # the best validation lower bound sits below the closed-form scale; a Gaussian h keeps it.
    import jax.numpy as jnp

    from cbdp_jax._src.estimator.objectives import conservative_fit, objective_functions
    from cbdp_jax._src.privacy.divergences import alpha_conjugate

    conj = objective_functions("renyi_scale_free", "renyi", "abs").conjugate
    rng = np.random.default_rng(12)
    h_p = jnp.asarray(rng.normal(1.0, 0.5, 20_000))
    light_q = jnp.asarray(rng.normal(0.0, 0.5, 20_000))
    heavy_q = jnp.asarray(rng.pareto(1.2, 20_000) * 0.3)
    one, zero = jnp.asarray(1.0), jnp.asarray(0.0)
    s_light, _ = conservative_fit("renyi_scale_free", conj, h_p, light_q, one, zero, 1.645, 4.0)
    s_heavy, _ = conservative_fit("renyi_scale_free", conj, h_p, heavy_q, one, zero, 1.645, 4.0)
    assert float(s_light) == 1.0
    assert float(s_heavy) < 1.0

    # The chosen scale's validation bound is at least the closed-form one (it is in the grid).
    def lcb(s):
        a, b = s * h_p, alpha_conjugate(s * heavy_q, 4.0, "abs")
        se = jnp.sqrt(jnp.var(a, ddof=1) / a.size + jnp.var(b, ddof=1) / b.size)
        return float(jnp.mean(a) - jnp.mean(b) - 1.645 * se)

    assert lcb(float(s_heavy)) >= lcb(1.0)


@pytest.mark.slow
@pytest.mark.ci
def test_kl_poly3_under_laplace_noise_is_trained_as_poly2_and_says_why():
    # A cubic term makes E_Q[exp h] infinite under Laplace noise, so D^{poly_3} = D^{poly_2} (exact:
    # 0.261403 at eps = 1); samples cannot see it (the capacity curve once certified 0.2627 > 0.2614).
    cfg = EstimatorConfig(steps=300, ensemble=2, batch_size=2048, confidence=0.999)
    res = estimate(jax.random.key(7), LaplaceMechanism(epsilon=1.0), samples=20_000,
                   adversary="poly", degree=3, config=cfg)  # fmt: skip
    assert res.adversary == "poly_2" and "poly_3 trained as poly_2" in res.warnings[0]
    # The reduction is exact: the exact layer gives poly_3 the poly_2 value (0.261403 at eps = 1).
    pair = exact.laplace_pair(1.0)
    exact_poly3 = exact.restricted_divergence(pair, "kl", "poly", degree=3).value
    exact_poly2 = exact.restricted_divergence(pair, "kl", "poly", degree=2).value
    assert exact_poly3 == pytest.approx(0.261403, abs=1e-6) == exact_poly2
    # (level 0.999: a correct bound exceeds the exact value with probability <= 0.1%)
    assert res.lower_bound <= exact_poly3
    # Negative controls: Renyi (polynomial conjugate growth) and poly_2 keep their class.
    renyi = estimate(jax.random.key(7), LaplaceMechanism(epsilon=1.0), samples=20_000,
                     adversary="poly", degree=3, divergence="renyi", alpha=2.0, config=cfg)  # fmt: skip
    assert renyi.adversary == "poly_3" and not any("trained as" in w for w in renyi.warnings)


@pytest.mark.slow
@pytest.mark.ci
def test_the_sweep_applies_the_same_kl_rule_per_class():
    """One rule (objectives.kl_domain_reduction) for the estimator and the sweep: poly_3 KL members are
    trained as poly_2 and say so; the poly_2 members beside them carry no note."""
    from cbdp_jax.adversaries import make_adversary
    from cbdp_jax.sweep import SweepConfig, estimate_sweep

    rows = estimate_sweep(
        jax.random.key(8),
        LaplaceMechanism(epsilon=1.0),
        adversaries=(make_adversary("poly", degree=2), make_adversary("poly", degree=3)),
        config=SweepConfig(steps=200, eval_every=100, batch_size=1024, test_samples=20_000),
    )
    notes = [any("poly_3 trained as poly_2" in w for w in r["warnings"]) for r in rows]
    assert notes == [False, True]
    assert [r["adversary"] for r in rows] == ["poly_2", "poly_2"]


def test_tail_check_refuses_an_infinite_variance_renyi_term_whatever_its_scale():
    # Renyi alpha = 2: f*(s) = s^2 / 4 + 1/2. With h = a x, x ~ Student t(3), f*(h) has tail index
    # 3/2 (infinite variance) for every a > 0, and the check must refuse at every scale. Centred at the
    # conjugate's infimum 1/2 the deviations are exactly (a x)^2 / 4, whose Hill index does not depend
    # on a (about 1.5 on 50k samples: far below 2 at any a).
    div = get_divergence("renyi", alpha=2.0)
    x = np.random.default_rng(0).standard_t(3, 50_000)
    for a in (1.0, 0.1, 0.01):
        t_q = np.asarray(div.conjugate(a * x), np.float64)
        held = certification.held_out_of_terms(a * x, t_q, div.conjugate_inf())
        check = held_out.tail_check(held)
        assert not check.passed, a
        assert check.index_q < 2.0, (a, check.index_q)
    # Negative control: centred at 0, as before the fix, the +1/2 dominates the deviations of a small
    # h and the same sample passes at a = 0.1 (Hill 3.71): the assertions above would catch that.
    t_q = np.asarray(div.conjugate(0.1 * x), np.float64)
    # (at the threshold 2 the 0-centred reading passes; the margin is set to 0 to show it)
    assert held_out.tail_check(certification.held_out_of_terms(0.1 * x, t_q, 0.0), 0.0).passed


@pytest.mark.parametrize(
    "divergence, alpha",
    [("renyi", 2.0), ("renyi", 4.0), ("alpha", 8.0), ("chi2", None), ("tv", None)],
)
def test_a_shrink_never_moves_a_critic_whose_tail_index_it_cannot_change(divergence, alpha):
    # Scaling h leaves Hill's index of h(X) and of f*(h) - inf f* unchanged for every conjugate but
    # KL's, so the shrink returns the critic as it is (host and traced), even on a heavy-tailed problem
    # (Laplace eps 2, slope 1.8: index 1.1) that the check refuses.
    div = get_divergence(divergence, alpha=alpha)
    h_p, h_q, h_fit = _shrink_problem(np.random.default_rng(2), 2.0, 1.8)
    need = certification.tail_target(100_000, 0.0)
    kw = dict(h_val_p=h_p, h_val_q=h_q, h_fit_q=h_fit, scale=0.7, shift=0.1, need=need)
    assert certification.shrink_for_tails(div, "fform", **kw) == (0.7, 0.1, 1.0)
    traced = certification.shrink_for_tails_traced(div, alpha, "fform", **kw)
    np.testing.assert_allclose([float(v) for v in traced], [0.7, 0.1, 1.0], rtol=1e-6)
    # Negative control: KL on the same problem does shrink.
    kl = get_divergence("kl")
    assert certification.shrink_for_tails(kl, "dv", **kw)[2] < 1.0


def test_a_critic_with_enormous_outputs_still_gets_a_valid_finite_sample_support():
    # Against a nearly non-private mechanism a trained critic can output ~1e7: every B on the grid
    # built from its spread makes exp(B - 1) overflow, so no candidate had a finite support and the
    # placeholder support [0, 1] was handed to the betting bound, which then raised ("observations
    # leave the stated support"). The search now falls back to B below the overflow.
    div = get_divergence("kl")
    rng = np.random.default_rng(5)
    h_p = 1e7 * (1.0 + rng.random(4000))
    h_q = -1e7 * (1.0 + rng.random(4000))
    lo_b, hi_b = 0.25 * 1e7, 4.0 * 2e7
    grid = list(np.geomspace(lo_b, hi_b, 32))
    # Negative control: the grid alone has no usable candidate.
    assert (
        certification_choice._best_bound(div, h_p, h_q, grid, 100_000, 0.95, "auto", False) is None
    )
    b, method, (lo, hi) = certification.choose_bound(div, h_p, h_q, n_test=100_000, confidence=0.95)
    assert 0 < b <= certification.largest_finite_bound(div) and math.isfinite(lo + hi)
    z = b * np.tanh(h_p / b) - np.exp(b * np.tanh(h_q / b) - 1.0)
    assert np.all((z >= lo) & (z <= hi))


@pytest.mark.parametrize("name", ["kl", "renyi", "tv", "hellinger", "chi2", "js"])
def test_the_largest_finite_bound_keeps_both_conjugate_terms_finite_in_float32(name):
    div = get_divergence(name, alpha=2.0 if name == "renyi" else None)
    cap = certification.largest_finite_bound(div)
    values = np.asarray(div.conjugate(np.array([cap, -cap, 2 * cap, -2 * cap], np.float32)))
    assert np.all(np.isfinite(values))  # at the cap, and at twice it (the margin for rounding)
    assert math.isfinite(sum(certification.support(div, cap)))


@pytest.mark.slow
@pytest.mark.ci
def test_randomized_response_at_eps_12_gets_a_finite_sample_bound_below_the_truth():
    # The case of the issue: 1e5 samples per side of randomized response at eps = 12 (KL = 11.9999).
    # It crashed with the finite-sample guarantee; now the bound is finite, below the truth (by far: n
    # samples can certify at most ~log n), and says how much n could certify. Deterministic checks:
    # the truth exceeds the sample-size ceiling, which the bound never exceeds.
    res = estimate(
        jax.random.key(12),
        RandomizedResponse(epsilon=12.0),
        samples=100_000,
        adversary="mlp",
        config=EstimatorConfig(steps=300, ensemble=2, batch_size=2048, guarantee="finite-sample"),
    )
    truth = (1 - 2 / (1 + math.exp(12.0))) * 12.0
    assert res.guarantee == "finite-sample" and math.isfinite(res.lower_bound)
    assert 0.0 <= res.lower_bound <= res.certifiable_max < truth
    assert any("can certify at most" in w for w in res.warnings)


def test_choosing_b_for_a_huge_kl_critic_matches_one_support_at_a_time():
    # KL's f*(B) = exp(B - 1) is finite up to B ~ 709, so candidate supports reach ~1e300 and the
    # Berry-Esseen prediction cubes their range (inf). Regression: supports computed in one pass were
    # once handed on as Python floats, whose ** raises OverflowError instead of giving inf.
    rng = np.random.default_rng(0)
    h_p, h_q = rng.normal(300.0, 50.0, 2000), rng.normal(0.0, 1.0, 2000)
    div = get_divergence("kl")
    b, method, (lo, hi) = certification.choose_bound(div, h_p, h_q, n_test=2000, confidence=0.95)
    # The chosen B's support is the one the single-interval routine gives (an independent call).
    assert (lo, hi) == certification.support(div, b)
    assert math.isfinite(b) and lo < 0 < hi and method in ("betting", "berry-esseen")


def _predictions_one_at_a_time(div, h_p, h_q, candidates, n_test, confidence):
    """The plan's scoring of candidate bounds B as it was written before the candidates were scored
    together: one at a time, one f* call and one moments computation each (the reference).
    ``[(k, predicted bound, method)]`` for each candidate k with a finite support and prediction."""
    out = []
    for k, b in enumerate(candidates):
        lo, hi = certification.support(div, b)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        hb_p, hb_q = b * np.tanh(h_p / b), b * np.tanh(h_q / b)
        with np.errstate(all="ignore"):
            t_q = np.asarray(
                certification_support._conjugate_program(np.asarray(hb_q), div=div), np.float64
            )
        value, m = certification.predicted_bound(hb_p - t_q, lo, hi, n_test, confidence)
        if math.isfinite(value):
            out.append((k, value, m))
    return out


@pytest.mark.parametrize(
    "name, alpha, scale",
    [("kl", None, 1.0), ("kl", None, 300.0), ("renyi", 2.0, 1.0), ("renyi", 5.0, 20.0),
     ("chi2", None, 3.0), ("tv", None, 1.0)],
)  # fmt: skip
@pytest.mark.parametrize("rows_budget", [1 << 22, 3000])
def test_scoring_every_candidate_b_at_once_gives_each_one_at_a_time_prediction(
    name, alpha, scale, rows_budget, monkeypatch
):
    # The candidates' terms and moments are rows of one array (or of groups of rows when the
    # validation sample is large: rows_budget = 3000 forces one row per group). Every prediction
    # must be the one-at-a-time prediction bit for bit, and so the chosen B, method and support.
    monkeypatch.setattr(certification_choice, "_ROWS_BUDGET", rows_budget)
    div = get_divergence(name, **({"alpha": alpha} if alpha else {}))
    rng = np.random.default_rng(7)
    h_p, h_q = rng.laplace(0.3, scale, 2001), rng.laplace(0.0, scale, 2001)
    med, top = np.median(np.abs(np.r_[h_p, h_q])), np.max(np.abs(np.r_[h_p, h_q]))
    candidates = list(np.geomspace(max(0.25 * med, 1e-3), 4.0 * top, 32))
    if div.conjugate_sup < math.inf:
        candidates = sorted({min(b, 0.99 * div.conjugate_sup) for b in candidates})
    want = _predictions_one_at_a_time(div, h_p, h_q, candidates, 5000, 0.95)
    assert len(want) >= 4  # not a vacuous comparison: several candidates are scored
    los, his = certification.supports(div, np.asarray(candidates, np.float64))
    usable = [k for k in range(len(candidates)) if np.isfinite(los[k]) and np.isfinite(his[k])]
    got = certification_choice._predictions(
        div, h_p, h_q, [(candidates[k], los[k], his[k], 1.0) for k in usable], 5000, 0.95, False
    )
    assert [(usable[i], value, m) for i, value, m in got] == want
    k, _, m = max(want, key=lambda c: c[1])  # the first of equal maxima, as the plan's search
    assert certification_choice._best_bound(
        div, h_p, h_q, candidates, 5000, 0.95, "auto", False
    ) == (
        candidates[k],
        m,
        certification.support(div, candidates[k]),
    )


@pytest.mark.parametrize("n", [1, 5, 1000, 1025, 70_000])
def test_conjugate_terms_padded_to_a_bucket_equal_the_unpadded_program(n):
    # f* is elementwise: padding the values to a power of two may not change a single bit.
    rng = np.random.default_rng(n)
    h = rng.standard_cauchy((3, n))
    for name, alpha in (("kl", None), ("renyi", 3.0), ("hellinger", None)):
        div = get_divergence(name, **({"alpha": alpha} if alpha else {}))
        with np.errstate(all="ignore"):
            want = np.stack(
                [
                    np.asarray(certification_support._conjugate_program(row, div=div), np.float64)
                    for row in h
                ]
            )
        np.testing.assert_array_equal(certification_support._conjugate_host(div, h), want)


@pytest.mark.parametrize(
    "name, alpha, scale", [("kl", None, 1.0), ("renyi", 2.0, 30.0), ("chi2", None, 3.0)]
)
@pytest.mark.parametrize("grid", [32, 8])
def test_every_multiplier_scored_at_once_gives_what_each_alone_gives(name, alpha, scale, grid):
    # The input-map plan tries critics t h for ten multipliers t. Scored together (one array of all
    # (t, B) rows), each t must get the B, method and support a search over the same grid gives
    # alone (choose_bound itself for the full grid of 32), and the prediction validation_score
    # gives for B tanh(t h / B): what a loop over t computes, bit for bit.
    div = get_divergence(name, **({"alpha": alpha} if alpha else {}))
    rng = np.random.default_rng(11)
    h_p, h_q = rng.laplace(0.3, scale, 1501), rng.laplace(0.0, scale, 1499)
    ts = [float(t) for t in np.geomspace(1.0, 1e-3, 10)]
    got = certification.choose_bounds(div, h_p, h_q, ts, n_test=8000, confidence=0.95, grid=grid)
    scores = []
    for t, (b, m, sup, score) in zip(ts, got, strict=True):
        tp, tq = t * h_p[:1499], t * h_q
        candidates = certification_choice._b_grid(div, tp, tq, grid)
        assert len(candidates) <= grid
        want = certification_choice._best_bound(div, tp, tq, candidates, 8000, 0.95, "auto", False)
        if grid == 32:
            assert want == certification.choose_bound(div, tp, tq, n_test=8000, confidence=0.95)
        assert (b, m, sup) == want
        assert score == certification.validation_score(
            div, b * np.tanh(tp / b), b * np.tanh(tq / b), sup, n_test=8000, confidence=0.95
        )
        scores.append(score)
    # Not vacuous: the multipliers disagree, so picking among them is a real choice.
    assert len(set(scores)) > 1 and all(math.isfinite(s) for s in scores)


def test_a_fixed_method_is_reported_for_every_multiplier():
    div = get_divergence("renyi", alpha=2.0)
    rng = np.random.default_rng(3)
    h_p, h_q = rng.normal(0.5, 1.0, 1000), rng.normal(0.0, 1.0, 1000)
    got = certification.choose_bounds(
        div, h_p, h_q, [1.0, 0.1], n_test=5000, confidence=0.95, method="betting"
    )
    assert [m for _, m, _, _ in got] == ["betting", "betting"]


def test_multipliers_whose_grid_overflows_fall_back_below_the_overflow():
    # A KL critic of ~1e7 makes f*(B) overflow on its whole grid at t = 1 (as in the test above for
    # choose_bound); at t = 1e-6 its grid is usable. Each t gets what choose_bound gives alone.
    div = get_divergence("kl")
    rng = np.random.default_rng(5)
    h_p, h_q = 1e7 * (1.0 + rng.random(4000)), -1e7 * (1.0 + rng.random(4000))
    got = certification.choose_bounds(div, h_p, h_q, [1.0, 1e-6], n_test=100_000, confidence=0.95)
    for t, (b, m, sup, _) in zip([1.0, 1e-6], got, strict=True):
        alone = certification.choose_bound(div, t * h_p, t * h_q, n_test=100_000, confidence=0.95)
        assert (b, m, sup) == alone and math.isfinite(sum(sup))
    # t = 1 took the fallback (B below the overflow); t = 1e-6 its ordinary grid, with a prediction.
    assert got[0][0] <= certification.largest_finite_bound(div) and math.isfinite(got[1][3])


@pytest.mark.parametrize("shape", [(2,), (160, 2), (400, 201)])
def test_float64_conjugate_padded_to_a_bucket_equals_the_unpadded_program(shape):
    # The certificate's float64 grids share one padded program; each value must be the unpadded one.
    rng = np.random.default_rng(sum(shape))
    s = rng.standard_cauchy(shape)
    for name, alpha in (("kl", None), ("renyi", 2.0)):
        div = get_divergence(name, **({"alpha": alpha} if alpha else {}))
        with jax.enable_x64(True), np.errstate(all="ignore"):
            want = np.asarray(
                certification_support._conjugate_program(jax.numpy.asarray(s), div=div)
            )
        assert want.dtype == np.float64
        np.testing.assert_array_equal(certification_support._conj64(div, s), want)
