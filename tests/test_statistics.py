"""The statistical core: moments, tail indices, betting and Berry-Esseen bounds, Bonferroni, Renyi map.

Every coverage test here repeats its bound over many independent samples and compares the miss rate
with the nominal delta using a binomial margin (never one draw with a lucky key), and each failure mode
the core guards against has a negative control showing the test would catch it.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from cbdp_jax._src.privacy.divergences import log_mean_exp
from cbdp_jax._src.statistics import berry_esseen, betting, bounds, held_out, tails
from cbdp_jax._src.statistics import moments as mom


def _binomial_upper(p: float, reps: int, z: float = 3.5) -> float:
    """Miss rate allowed for a level-p bound over ``reps`` repeats: p + z binomial standard errors.

    z = 3.5 keeps the chance that a correct bound fails the test below 3e-4 (normal approximation).
    """
    return p + z * math.sqrt(p * (1 - p) / reps)


# -------------------------------------------------------------------------------------------------
# Moments
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cuts", [(0, 1000), (0, 1, 999, 1000), (0, 333, 334, 900, 1000)])
def test_merged_chunk_moments_equal_whole_sample_moments(cuts):
    rng = np.random.default_rng(0)
    x = rng.standard_t(5, 1000) * 3 + 7
    acc = mom.empty()
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        acc = mom.merge(acc, mom.to_host(mom.of(jnp.asarray(x[a:b]))))
    # float32 chunk moments merged in float64: agreement to float32 rounding of each chunk.
    assert float(acc.count) == 1000
    np.testing.assert_allclose(float(acc.mean), x.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(acc.variance), x.var(ddof=1), rtol=1e-5)
    assert float(acc.lo) == pytest.approx(x.min(), rel=1e-6)
    assert float(acc.hi) == pytest.approx(x.max(), rel=1e-6)


def test_batched_masked_moments_match_per_row_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 50))
    n_valid = np.array([50, 17, 2])
    mask = np.arange(50)[None, :] < n_valid[:, None]
    with jax.enable_x64(True):
        m = mom.to_host(mom.of(jnp.asarray(x), jnp.asarray(mask)))
    for r in range(3):
        row = x[r, : n_valid[r]]
        assert m.count[r] == n_valid[r]
        np.testing.assert_allclose(m.mean[r], row.mean(), rtol=1e-12)
        np.testing.assert_allclose(m.m2[r], ((row - row.mean()) ** 2).sum(), rtol=1e-12)


@pytest.mark.parametrize("n", [2, 7, 1000])
def test_host_moments_of_a_sample_match_the_device_ones(n):
    # moments_of_sample (NumPy, float64) against mom.of / pair_moments in a 64-bit device program: the
    # same fields up to summation order (1e-12 relative: sums of <= 1000 terms of order 1 in float64).
    z = np.random.default_rng(n).standard_cauchy(n)
    m, pairs = berry_esseen.moments_of_sample(z)
    with jax.enable_x64(True):
        zz = jnp.asarray(z)
        want = [mom.to_host(mom.of(zz)), *(mom.to_host(p) for p in berry_esseen.pair_moments(zz))]
    for got, ref in zip([m, pairs.w, pairs.v], want, strict=True):
        for field, a, b in zip(mom.Moments._fields, got, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300, err_msg=field)


def test_host_moments_of_fewer_than_two_values_have_no_pairs():
    for z in (np.zeros(0), np.ones(1)):
        m, pairs = berry_esseen.moments_of_sample(z)
        assert float(m.count) == z.size and float(pairs.w.count) == float(pairs.v.count) == 0


def test_berry_esseen_on_a_huge_support_is_the_same_for_python_and_numpy_floats():
    # A support of width 2e200 (a critic near f*'s overflow): r**2 and r**3 are infinite. With Python
    # floats the bound once raised OverflowError, and with NumPy's it came out NaN ("feasible"): both
    # must refuse it (-inf, not feasible), the same for either kind of float.
    z = np.random.default_rng(0).uniform(-1.0, 1.0, 200_000)
    m, pairs = berry_esseen.moments_of_sample(z)
    # The refusal is deliberate, so it comes without a RuntimeWarning (overflow, inf - inf): the
    # calls run with NumPy's floating-point warnings turned into errors.
    with np.errstate(all="raise"):
        a = berry_esseen.lower_bound(m, pairs, -1e200, 1e200, 0.95)
        b = berry_esseen.lower_bound(m, pairs, np.float64(-1e200), np.float64(1e200), 0.95)
    np.testing.assert_equal(tuple(a), tuple(b))
    assert not a.feasible and a.lower == -math.inf
    # Control: the same sample on its real support [-1, 1] gives a finite, feasible bound.
    ok = berry_esseen.lower_bound(m, pairs, -1.0, 1.0, 0.95)
    assert ok.feasible and math.isfinite(ok.lower)


def test_merge_with_an_empty_side_is_the_identity():
    m = mom.Moments(np.array(5.0), np.array(2.0), np.array(3.0), np.array(-1.0), np.array(4.0))
    for out in (mom.merge(mom.empty(), m), mom.merge(m, mom.empty())):
        assert tuple(float(f) for f in out) == (5.0, 2.0, 3.0, -1.0, 4.0)


def _chan_merge_without_guards(a: mom.Moments, b: mom.Moments) -> mom.Moments:
    """The parallel update as it was before the guards (the negative control below)."""
    total = a.count + b.count
    safe = np.where(total > 0, total, 1)
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / safe)
    m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / safe)
    return mom.Moments(total, np.where(total > 0, mean, 0), np.where(total > 0, m2, 0), 0, 0)


def test_a_sample_with_an_overflowed_observation_has_infinite_moments_never_nan():
    # A float32 chunk with an observation that overflowed (|a - b|^3 of a pair of critic values of
    # order 1e13 is beyond float32's 3.4e38): its mean is +inf, and its variance must be +inf too, in
    # the chunk and after every merge (with an empty accumulator, a finite chunk, another infinite
    # chunk), in NumPy and in a device program, and without an invalid operation on the host.
    big = jnp.asarray([1.0, 2.0, 1e13, 4.0], jnp.float32) ** 3  # overflows in the device program
    finite = mom.of(jnp.asarray([1.0, 2.0, 3.0]))
    chunk = mom.of(big)
    assert float(chunk.mean) == math.inf and float(chunk.m2) == math.inf
    host = mom.to_host(chunk)
    with np.errstate(all="raise"):
        merged = [
            mom.merge(mom.empty(), host),
            mom.merge(host, mom.empty()),
            mom.merge(mom.to_host(finite), host),
            mom.merge(host, host),
        ]
    merged.append(mom.merge(finite, chunk))  # traced arithmetic, float32
    for m in merged:
        assert float(m.mean) == math.inf and float(m.m2) == math.inf, m
        assert float(m.variance) == math.inf and float(m.std_error) == math.inf
    # A finite merge is unchanged (the same fields as before the guards, to the bit).
    a, b = mom.to_host(finite), mom.to_host(mom.of(jnp.asarray([7.0, -2.0])))
    ref = _chan_merge_without_guards(a, b)
    got = mom.merge(a, b)
    assert (got.count, got.mean, got.m2) == (ref.count, ref.mean, ref.m2)
    # Negative control: without the guards, an empty accumulator and an infinite chunk give NaN.
    with np.errstate(all="ignore"):
        bad = _chan_merge_without_guards(mom.empty(), host)
    assert math.isnan(float(bad.m2))


# -------------------------------------------------------------------------------------------------
# Tail index (Hill) and the CLT's tail check
# -------------------------------------------------------------------------------------------------


def _sketch_of(x: np.ndarray, centre: float = 0.0) -> tails.TailSketch:
    return jax.device_get(tails.sketch(jnp.asarray(x), centre, tails.DEFAULT_CAPACITY))


@pytest.mark.parametrize("alpha", [1.5, 2.5, 4.0])
def test_hill_recovers_the_index_of_a_pareto_sample(alpha):
    rng = np.random.default_rng(2)
    x = rng.pareto(alpha, 200_000) + 1.0  # P(X > x) = x^(-alpha), x >= 1
    est = tails.hill(_sketch_of(x))
    # Hill is unbiased-ish for exact Pareto tails; 4 standard errors (index / sqrt(k)).
    assert abs(est.index - alpha) < 4 * est.std_error


def _held(t_p: np.ndarray, t_q: np.ndarray) -> held_out.HeldOut:
    with jax.enable_x64(True):
        tp, tq = jnp.asarray(t_p), jnp.asarray(t_q)
        z = tp - tq
        return held_out.HeldOut(
            mom.to_host(mom.of(tp)),
            mom.to_host(mom.of(tq)),
            mom.to_host(mom.of(z)),
            berry_esseen.PairMoments(*(mom.to_host(m) for m in berry_esseen.pair_moments(z))),
            _sketch_of(t_p, float(np.median(t_p))),
            _sketch_of(t_q, float(np.median(t_q))),
        )


def test_pareto_one_and_a_half_is_refused_and_a_light_tail_is_not():
    rng = np.random.default_rng(3)
    light = rng.normal(size=100_000)
    heavy = rng.pareto(1.5, 100_000)  # infinite variance
    refused, check = held_out.certify(_held(light, heavy), guarantee="asymptotic", confidence=0.95)
    assert not refused.certified and refused.value == -math.inf
    assert "heavy tail" in refused.reason and check.index_q < 2.0
    # Negative control: the same call on a light-tailed Q-term certifies.
    ok, check_ok = held_out.certify(
        _held(light, rng.exponential(size=100_000)), guarantee="asymptotic", confidence=0.95
    )
    assert ok.certified and check_ok.passed and math.isfinite(ok.value)


# -------------------------------------------------------------------------------------------------
# Finite-sample bounds: coverage at their level, and the CLT failing where they do not
# -------------------------------------------------------------------------------------------------


def test_betting_bound_covers_at_its_level_on_2000_samples():
    rng = np.random.default_rng(4)
    reps, n = 2000, 60
    x = rng.beta(0.5, 3.0, size=(reps, n))  # skewed, mean 1/7
    lower = betting.lower_bounds(x, 0.0, 1.0, 0.95)
    miss = float(np.mean(lower > 1.0 / 7.0))
    assert miss <= _binomial_upper(0.05, reps)


def test_betting_sequence_covers_under_optional_stopping():
    # Stop as soon as the bound passes the true mean (the most favourable stopping rule for a miss):
    # an anytime-valid sequence still misses with probability <= delta.
    rng = np.random.default_rng(5)
    reps, mu, misses = 400, 0.3, 0
    for _ in range(reps):
        state = betting.sequence_init(np.linspace(0.0, 1.0, 401)[1:])
        for _ in range(20):
            state = betting.sequence_update(state, rng.binomial(1, mu, 50).astype(float), 0.9)
            if state.lower > mu:
                misses += 1
                break
    assert misses / reps <= _binomial_upper(0.1, reps)


def test_clt_misses_far_more_often_than_its_level_where_betting_does_not():
    # Negative control for the coverage tests above: X = 0 w.p. 0.02 else 1 (mean 0.98), n = 50.
    # With probability 0.98^50 = 0.36 the sample is all ones, SE = 0 and the CLT bound is 1 > 0.98.
    rng = np.random.default_rng(6)
    reps, n = 2000, 50
    x = (rng.uniform(size=(reps, n)) > 0.02).astype(float)
    z = stats.norm.ppf(0.95)
    clt = x.mean(1) - z * x.std(1, ddof=1) / math.sqrt(n)
    assert np.mean(clt > 0.98) > 0.3
    bet = betting.lower_bounds(x, 0.0, 1.0, 0.95)
    assert np.mean(bet > 0.98) <= _binomial_upper(0.05, reps)


def test_berry_esseen_bound_covers_at_its_level():
    rng = np.random.default_rng(7)
    reps, n, misses = 300, 20_000, 0
    for _ in range(reps):
        x = rng.beta(2.0, 5.0, n)
        m, pairs = berry_esseen.moments_of_sample(x)
        be = berry_esseen.lower_bound(m, pairs, 0.0, 1.0, 0.95)
        assert be.feasible
        misses += be.lower > 2.0 / 7.0
    assert misses / reps <= _binomial_upper(0.05, reps)


def test_berry_esseen_is_nearly_as_tight_as_the_clt_at_large_n_and_betting_is_not():
    # Width over the CLT's z * s / sqrt(n) at n = 1e5: Berry-Esseen pays its constant and the moment
    # bounds' slack (about 1.15 here); betting pays Ville's inequality, sqrt(2 log 20) / 1.645 = 1.49.
    rng = np.random.default_rng(8)
    x = rng.beta(2.0, 5.0, 100_000)
    clt = stats.norm.ppf(0.95) * x.std(ddof=1) / math.sqrt(x.size)
    m, pairs = berry_esseen.moments_of_sample(x)
    be = berry_esseen.lower_bound(m, pairs, 0.0, 1.0, 0.95)
    assert (x.mean() - be.lower) / clt < 1.3
    assert (x.mean() - betting.lower_bound(x, 0.0, 1.0, 0.95)) / clt > 1.4


def test_berry_esseen_refuses_when_the_sample_is_too_small_for_the_range():
    x = np.random.default_rng(9).beta(2.0, 5.0, 200)
    m, pairs = berry_esseen.moments_of_sample(x)
    out = bounds.finite_sample_lower_bound(
        lo=-100.0, hi=100.0, confidence=0.95, method="berry-esseen", z=m, pairs=pairs
    )
    assert not out.certified and out.value == -math.inf and "Berry-Esseen" in out.reason


# -------------------------------------------------------------------------------------------------
# Family-wise levels
# -------------------------------------------------------------------------------------------------


def test_bonferroni_is_needed_for_the_maximum_of_two_bounds():
    # Two directions with the same true value mu: the max of two 95% bounds misses with probability
    # 1 - 0.95^2 = 9.75%; at level 1 - 0.05/2 each, at most 5%.
    rng = np.random.default_rng(10)
    reps, n, mu = 4000, 400, 1.0
    a = rng.normal(mu, 1.0, (reps, n))
    b = rng.normal(mu, 1.0, (reps, n))

    def clt(x, level):
        return x.mean(1) - stats.norm.ppf(level) * x.std(1, ddof=1) / math.sqrt(n)

    single = np.maximum(clt(a, 0.95), clt(b, 0.95))
    level = bounds.family_confidence(0.95, 2)
    family = np.maximum(clt(a, level), clt(b, level))
    assert level == pytest.approx(0.975)
    assert np.mean(single > mu) > _binomial_upper(0.05, reps)  # would fail without the correction
    assert np.mean(family > mu) <= _binomial_upper(0.05, reps)


def test_clt_lower_bound_uses_the_family_level():
    p = mom.Moments(100.0, 1.0, 99.0, 0.0, 2.0)  # variance 1
    q = mom.Moments(100.0, 0.5, 99.0, 0.0, 1.0)
    one = bounds.clt_lower_bound(p, q, confidence=0.95)
    two = bounds.clt_lower_bound(p, q, confidence=0.95, family_size=2)
    se = math.sqrt(2 / 100)
    assert one.value == pytest.approx(0.5 - stats.norm.ppf(0.95) * se, rel=1e-12)
    assert two.value == pytest.approx(0.5 - stats.norm.ppf(0.975) * se, rel=1e-12)
    assert two.confidence == pytest.approx(0.975) and two.family_size == 2


# -------------------------------------------------------------------------------------------------
# The Renyi transform
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0, 8.0])
def test_renyi_transform_inverts_and_matches_the_closed_form(alpha):
    for v in (0.0, 0.1, 1.0, 10.0):
        r = bounds.renyi_from_f(v, alpha)
        assert r == pytest.approx(math.log1p(alpha * (alpha - 1) * v) / (alpha - 1), rel=1e-13)
        assert bounds.f_from_renyi(r, alpha) == pytest.approx(v, rel=1e-12, abs=1e-15)
    assert bounds.renyi_from_f(-1.0 / (alpha * (alpha - 1)), alpha) == -math.inf
    assert bounds.renyi_from_f(math.inf, alpha) == math.inf


def test_a_bound_mapped_from_the_f_scale_is_below_the_renyi_scale_delta_method_bound():
    # The map is concave, so g(v - z s) <= g(v) - z s g'(v): computing "estimate - z SE" on the Renyi
    # scale (what the experiments used to do) gives a larger, invalid number.
    alpha, v, s, z = 4.0, 0.8, 0.05, 1.645
    g = lambda x: bounds.renyi_from_f(x, alpha)  # noqa: E731
    slope = alpha / (1 + alpha * (alpha - 1) * v)
    assert g(v - z * s) < g(v) - z * s * slope


def test_log_mean_exp_has_the_numerical_gradient_it_claims():
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(11).normal(size=7) * 3)
        chex.assert_numerical_grads(log_mean_exp, (x,), order=2, atol=1e-6, rtol=1e-6)


# -------------------------------------------------------------------------------------------------
# What n samples can certify
# -------------------------------------------------------------------------------------------------


def test_certifiable_max_grows_like_log_n_and_is_finite():
    kl = lambda s: np.exp(s - 1.0)  # noqa: E731
    caps = [bounds.certifiable_max(kl, n, 0.95) for n in (10**2, 10**4, 10**6)]
    assert all(math.isfinite(c) for c in caps)
    # Each factor 100 in n adds about log(100) = 4.6 (the best B grows like log n).
    gains = np.diff(caps)
    assert np.all(gains > 3.5) and np.all(gains < 5.0)
    assert caps[-1] < math.log(10**6)


def test_moments_of_rows_are_each_rows_moments_bit_for_bit():
    # The plan scores all its candidate bounds with one call: each row's moments and pair moments
    # must be exactly those of the row alone (odd and even lengths, heavy tails, tiny and huge scales).
    rng = np.random.default_rng(3)
    for n in (4, 5, 1001, 22_223):
        z = rng.standard_cauchy((6, n)) * rng.choice([1e-3, 1.0, 1e3], (6, n))
        rows_m, rows_pairs = berry_esseen.moments_of_rows(z)
        for k in range(z.shape[0]):
            m, pairs = berry_esseen.moments_of_sample(z[k])
            np.testing.assert_array_equal(np.array(tuple(m)), [f[k] for f in rows_m])
            np.testing.assert_array_equal(np.array(tuple(pairs.w)), [f[k] for f in rows_pairs.w])
            np.testing.assert_array_equal(np.array(tuple(pairs.v)), [f[k] for f in rows_pairs.v])


def test_host_moments_are_the_masked_reduction_bit_for_bit():
    # of_host skips the masking passes of the traceable reduction (its mask is all true); its fields
    # must still be exactly the masked reduction's, for whole samples and for rows, contiguous or not,
    # with an infinite value among them.
    rng = np.random.default_rng(11)
    for shape in ((7,), (3, 1001), (5, 22_223)):
        x = rng.standard_cauchy(shape) * rng.choice([1e-3, 1.0, 1e6], shape)
        x[..., 1] = np.inf
        for view in (x, x[..., ::-1]):
            for axis in (None, -1):
                dense = np.ascontiguousarray(view)
                dense = dense.ravel() if axis is None else dense
                want = mom._reduced(np, dense, np.ones(dense.shape, bool), -1)
                got = mom.of_host(view, axis=axis)
                for g, w in zip(got, want, strict=True):
                    np.testing.assert_array_equal(g, w)
                    assert np.shape(g) == np.shape(w) and type(g) is type(w)
    # Negative control: bit-for-bit equality is sensitive to the order of a sum (these rows' sums
    # reversed differ in the last bits), so a fast path that summed differently would fail above.
    y = rng.standard_cauchy((5, 22_223))
    assert not np.array_equal(np.sum(y, axis=-1), np.sum(y[:, ::-1], axis=-1))
