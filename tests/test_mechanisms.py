"""Mechanisms: output laws against scipy and closed forms, jit/scan behaviour, validation.

Statistical checks use a fixed key, so they are deterministic; each tolerance is stated as a multiple of
the Monte Carlo standard error (SE). A 5-SE two-sided check would fail with probability < 1e-6 for a
random key if the implementation were right; a KS test with p > 1e-4 would fail with probability 1e-4.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from cbdp_jax import InvalidParameterError
from cbdp_jax.mechanisms import (
    MECHANISM_NAMES,
    BlackBox,
    GaussianMechanism,
    JointRelease,
    LaplaceMechanism,
    MatrixMechanism,
    Mechanism,
    Mixture,
    NeighbouringPair,
    NonPrivateRelease,
    PostProcessed,
    RandomizedResponse,
    canonical_pair,
    linear_post_processing,
    make_mechanism,
)

KEY = jax.random.key(20190611)
N_BIG = 200_000
W_EX = [[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]  # two range queries over a domain of 3
A_EX = [
    [1.0, 1.0, 1.0],
    [1.0, 0.0, 0.0],
    [0.0, 1.0, 0.0],
    [0.0, 0.0, 1.0],
]  # total + identity, rank 3


def _shift(y):
    return y + 1.0


def _all_mechanisms():
    """(id, mechanism, dataset) for one instance of every mechanism type."""
    lap = LaplaceMechanism(epsilon=0.7, sensitivity=(1.0, 2.0))
    gau = GaussianMechanism(sigma=1.3)
    rr = RandomizedResponse(epsilon=1.0, k=4)
    return [
        ("laplace", lap, np.array([0.5, -1.0])),
        ("gaussian", gau, 0.2),
        ("rr", rr, 2),
        (
            "matrix",
            MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=1.0),
            np.array([3.0, 1, 2]),
        ),
        ("nonprivate", NonPrivateRelease(dim=2), np.array([1.0, 2.0])),
        (
            "mixture",
            Mixture(first=LaplaceMechanism(epsilon=1.0), second=gau, weight=0.3),
            np.array([1.5]),
        ),
        ("joint", JointRelease(mechanisms=(lap, rr)), (np.array([0.5, -1.0]), 1)),
        ("linear", linear_post_processing(lap, [[1.0, -1.0], [2.0, 0.5]]), np.array([0.5, 2.0])),
        (
            "blackbox",
            BlackBox(sampler=lambda k, d, n: d + 2.0 * jax.random.normal(k, (n, 3)), dim=3),
            0.7,
        ),
    ]


ALL = _all_mechanisms()
ALL_IDS = [a[0] for a in ALL]


def _raises_naming(name):
    """pytest.raises for InvalidParameterError whose message starts a `name=value is invalid` clause."""
    return pytest.raises(InvalidParameterError, match=rf"(^|\W){name}=")


# --------------------------------------------------------------------------------------------------
# Laplace and Gaussian against scipy
# --------------------------------------------------------------------------------------------------


# float64 parametrisations need x64 on (tests/conftest.py)
DTYPES = [None, pytest.param(jnp.float64, marks=pytest.mark.x64)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_laplace_moments_and_ks(dtype):
    eps, centre = 0.7, np.array([0.5, -1.0])
    mech = LaplaceMechanism(epsilon=eps, sensitivity=(1.0, 2.0))
    x = np.asarray(mech.sample(KEY, centre, N_BIG, dtype=dtype), dtype=np.float64)
    assert x.shape == (N_BIG, 2)
    b = 1.0 / eps
    # Lap(0, b): sd 2^(1/2) b, so the sample mean has SE sqrt(2) b / sqrt(n).
    np.testing.assert_array_less(
        np.abs(x.mean(0) - centre), 5 * math.sqrt(2) * b / math.sqrt(N_BIG)
    )
    # Variance 2 b^2; the sample variance has SE sqrt(mu4 - sigma^4)/sqrt(n) = sqrt(24 - 4) b^2/sqrt(n).
    np.testing.assert_array_less(
        np.abs(x.var(0) - 2 * b * b), 5 * math.sqrt(20.0) * b * b / math.sqrt(N_BIG)
    )
    for i in range(2):
        assert stats.kstest(x[:, i], stats.laplace(loc=centre[i], scale=b).cdf).pvalue > 1e-4
    # The two coordinates are independent: sample correlation has SE 1/sqrt(n).
    assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1]) < 5 / math.sqrt(N_BIG)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gaussian_moments_and_ks(dtype):
    sigma, centre = 1.3, np.array([0.2, -0.3, 1.0])
    mech = GaussianMechanism(sigma=sigma, sensitivity=(1.0, 0.5, 2.0))
    x = np.asarray(mech.sample(KEY, centre, N_BIG, dtype=dtype), dtype=np.float64)
    assert x.shape == (N_BIG, 3)
    # Mean SE sigma/sqrt(n); sample variance SE sqrt(3 - 1) sigma^2 / sqrt(n).
    np.testing.assert_array_less(np.abs(x.mean(0) - centre), 5 * sigma / math.sqrt(N_BIG))
    np.testing.assert_array_less(
        np.abs(x.var(0) - sigma**2), 5 * math.sqrt(2.0) * sigma**2 / math.sqrt(N_BIG)
    )
    for i in range(3):
        assert stats.kstest(x[:, i], stats.norm(loc=centre[i], scale=sigma).cdf).pvalue > 1e-4


@pytest.mark.x64
def test_laplace_and_gaussian_log_density_match_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=(50, 2))
    centre = np.array([0.5, -1.0])
    lap = LaplaceMechanism(epsilon=0.7, sensitivity=(1.0, 2.0))
    gau = GaussianMechanism(sigma=1.3, sensitivity=(1.0, 2.0))
    # Closed forms in float64: agreement to rounding (1e-12 relative).
    expected_lap = stats.laplace.logpdf(x, loc=centre, scale=1 / 0.7).sum(1)
    expected_gau = stats.norm.logpdf(x, loc=centre, scale=1.3).sum(1)
    np.testing.assert_allclose(lap.log_density(centre, x), expected_lap, rtol=1e-12)
    np.testing.assert_allclose(gau.log_density(centre, x), expected_gau, rtol=1e-12)


@pytest.mark.x64
@settings(max_examples=15, deadline=None)
@given(
    eps=st.floats(0.05, 20.0),
    sens=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=4),
    scale=st.floats(0.1, 10.0),
)
def test_log_density_matches_scipy_for_random_parameters(eps, sens, scale):
    d = len(sens)
    rng = np.random.default_rng(d)
    x = rng.normal(scale=scale, size=(7, d))
    centre = np.asarray(sens)  # the canonical neighbour's answer
    lap = LaplaceMechanism(epsilon=eps, sensitivity=sens)
    gau = GaussianMechanism(sigma=scale, sensitivity=sens)
    np.testing.assert_allclose(
        lap.log_density(centre, x),
        stats.laplace.logpdf(x, loc=centre, scale=1 / eps).sum(1),
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        gau.log_density(centre, x),
        stats.norm.logpdf(x, loc=centre, scale=scale).sum(1),
        rtol=1e-10,
    )


@pytest.mark.x64
def test_query_callable_computes_the_centre():
    mech = LaplaceMechanism(epsilon=2.0, query=lambda data: jnp.sum(data, keepdims=True))
    data = np.array([1.0, 2.0, 3.0])
    n = 50_000
    x = np.asarray(mech.sample(KEY, data, n, dtype=jnp.float64))
    # Centre 6; mean SE sqrt(2) (1/2) / sqrt(n).
    assert abs(x.mean() - 6.0) < 5 * math.sqrt(2) * 0.5 / math.sqrt(n)
    np.testing.assert_allclose(
        mech.log_density(data, [[6.5]]), stats.laplace.logpdf(6.5, 6.0, 0.5), rtol=1e-12
    )


def test_family_and_noise_scale_attributes():
    lap = LaplaceMechanism(epsilon=4.0, sensitivity=[1, 2])
    gau = GaussianMechanism(sigma=0.5)
    assert (lap.family, lap.noise_scale, lap.sensitivity, lap.dim) == (
        "laplace",
        0.25,
        (1.0, 2.0),
        2,
    )
    assert (gau.family, gau.noise_scale, gau.sensitivity, gau.dim) == ("gaussian", 0.5, (1.0,), 1)


# --------------------------------------------------------------------------------------------------
# Randomized response
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k,true", [(2, 0), (4, 2)])
def test_randomized_response_frequencies(k, true):
    eps, n = 1.0, 100_000
    rr = RandomizedResponse(epsilon=eps, k=k)
    x = np.asarray(rr.sample(KEY, true, n))
    assert x.shape == (n, k)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.sum(1), 1.0)  # one-hot rows
    freq = x.mean(0)
    p = math.e / (math.e + k - 1)
    expected = np.full(k, (1 - p) / (k - 1))
    expected[true] = p
    # Each frequency is a binomial proportion: SE sqrt(f (1 - f) / n).
    np.testing.assert_array_less(
        np.abs(freq - expected), 5 * np.sqrt(expected * (1 - expected) / n)
    )


@pytest.mark.x64
def test_randomized_response_log_density_exact():
    rr = RandomizedResponse(epsilon=1.0, k=4)
    points = np.vstack([np.eye(4), [[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    got = np.asarray(rr.log_density(2, points))
    p_true, p_other = math.e / (math.e + 3), 1 / (math.e + 3)
    expected = np.log([p_other, p_other, p_true, p_other])
    np.testing.assert_allclose(got[:4], expected, rtol=1e-12)
    assert np.all(got[4:] == -np.inf)  # off the one-hot vertices
    assert rr.p_true == pytest.approx(p_true, rel=1e-14)


def test_randomized_response_with_traced_category():
    rr = RandomizedResponse(epsilon=1.0, k=4)
    eager = rr.sample(KEY, 1, 16)
    jitted = jax.jit(lambda key, c: rr.sample(key, c, 16))(KEY, 1)
    np.testing.assert_array_equal(eager, jitted)


# --------------------------------------------------------------------------------------------------
# Matrix mechanism
# --------------------------------------------------------------------------------------------------


@pytest.mark.x64
def test_matrix_mechanism_mean_and_covariance():
    eps = 1.0
    mm = MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=eps)
    w, a = np.array(W_EX), np.array(A_EX)
    counts = np.array([3.0, 1.0, 2.0])
    x = np.asarray(mm.sample(KEY, counts, N_BIG, dtype=jnp.float64))
    assert x.shape == (N_BIG, 2)
    r = w @ np.linalg.pinv(a)
    norm_a = 2.0  # largest column L1 norm of A_EX, by inspection
    cov = 2 * (norm_a / eps) ** 2 * r @ r.T
    # Mean W x, SE sqrt(C_ii / n).
    np.testing.assert_array_less(np.abs(x.mean(0) - w @ counts), 5 * np.sqrt(np.diag(cov) / N_BIG))
    # Covariance entries: SE of the mean of z_ij = (x_i - m_i)(x_j - m_j), estimated from the sample.
    c = x - x.mean(0)
    z = c[:, :, None] * c[:, None, :]
    se = z.std(0) / math.sqrt(N_BIG)
    np.testing.assert_array_less(np.abs(z.mean(0) - cov), 5 * se)
    assert (mm.strategy_norm, mm.noise_scale, mm.noise_dim, mm.domain_size) == (2.0, 2.0, 4, 3)
    np.testing.assert_allclose(mm.reconstruction @ a, w, atol=1e-12)  # W A^+ A = W


@pytest.mark.x64
def test_matrix_mechanism_log_density_reduces_to_laplace():
    eps = 0.8
    rng = np.random.default_rng(1)
    y = rng.normal(scale=2.0, size=(20, 3))
    counts = np.array([1.0, 0.0, 2.0])
    # A = 2 I: ||A||_1 = 2 and W A^+ = I/2, so the output is counts + Lap(1/eps) on each coordinate.
    mm = MatrixMechanism(workload=np.eye(3), strategy=2 * np.eye(3), epsilon=eps)
    np.testing.assert_allclose(
        mm.log_density(counts, y),
        stats.laplace.logpdf(y, loc=counts, scale=1 / eps).sum(1),
        rtol=1e-12,
    )
    # Permutation strategy and invertible workload: y = W (x + P^T Z), density by change of variables.
    w = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    perm = np.eye(3)[[2, 0, 1]]
    mm2 = MatrixMechanism(workload=w, strategy=perm, epsilon=eps)
    z = np.linalg.solve(w, y.T).T - counts
    expected = stats.laplace.logpdf(z, scale=1 / eps).sum(1) - math.log(2.0)
    np.testing.assert_allclose(mm2.log_density(counts, y), expected, rtol=1e-12)


def test_matrix_mechanism_without_density_raises():
    mm = MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=1.0)
    with pytest.raises(NotImplementedError, match="not invertible"):
        mm.log_density(np.zeros(3), np.zeros((2, 2)))


def test_matrix_mechanism_rejects_bad_matrices():
    with pytest.raises(
        InvalidParameterError, match=r"strategy=.*full column rank m = 3, got rank 2"
    ):
        MatrixMechanism(workload=W_EX, strategy=[[1, 1, 0], [0, 0, 1], [1, 1, 1]], epsilon=1.0)
    with _raises_naming("strategy"):
        MatrixMechanism(workload=W_EX, strategy=np.eye(4), epsilon=1.0)
    with _raises_naming("workload"):
        MatrixMechanism(workload=[[1.0, np.nan, 0.0]], strategy=np.eye(3), epsilon=1.0)
    with _raises_naming("epsilon"):
        MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=0.0)
    with _raises_naming("dataset"):
        MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=1.0).sample(KEY, np.zeros(4), 3)


# --------------------------------------------------------------------------------------------------
# Combinators
# --------------------------------------------------------------------------------------------------


def test_mixture_component_frequency():
    weight, n = 0.3, 100_000
    zero = NonPrivateRelease(dim=1)
    one = PostProcessed(mechanism=zero, fn=_shift, out_dim=1)
    mix = Mixture(first=zero, second=one, weight=weight)
    x = np.asarray(mix.sample(KEY, 0.0, n))
    assert set(np.unique(x)) == {0.0, 1.0}
    # Fraction of draws from `first` (the zeros): binomial proportion, SE sqrt(w (1 - w) / n).
    assert abs(np.mean(x == 0.0) - weight) < 5 * math.sqrt(weight * (1 - weight) / n)


@pytest.mark.x64
def test_mixture_log_density_is_the_mixture_of_densities():
    lap, gau = LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.5)
    mix = Mixture(first=lap, second=gau, weight=0.25)
    x = np.linspace(-6, 6, 25)[:, None]
    expected = np.log(
        0.25 * stats.laplace.pdf(x[:, 0], 0.4, 1.0) + 0.75 * stats.norm.pdf(x[:, 0], 0.4, 1.5)
    )
    np.testing.assert_allclose(mix.log_density(0.4, x), expected, rtol=1e-12)
    endpoint = Mixture(first=lap, second=gau, weight=1.0)
    np.testing.assert_allclose(endpoint.log_density(0.4, x), lap.log_density(0.4, x), rtol=1e-14)
    with pytest.raises(NotImplementedError, match="point mass"):
        Mixture(first=lap, second=NonPrivateRelease(), weight=0.5).log_density(0.0, x)


@pytest.mark.x64
def test_joint_release_shapes_slices_marginals_and_independence():
    lap, gau = LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.0, sensitivity=(1, 1))
    joint = JointRelease(mechanisms=[lap, lap, gau])
    assert joint.dim == 4
    assert joint.component_slices == (slice(0, 1), slice(1, 2), slice(2, 4))
    n = 50_000
    # Sequential composition (the same data twice) for the Laplace pair, parallel for the Gaussian.
    x = np.asarray(joint.sample(KEY, (5.0, 5.0, np.array([0.0, -2.0])), n, dtype=jnp.float64))
    assert x.shape == (n, 4)
    blocks = joint.split(x)
    assert [b.shape for b in blocks] == [(n, 1), (n, 1), (n, 2)]
    for i, law in enumerate(
        [stats.laplace(loc=5.0), stats.laplace(loc=5.0), stats.norm(), stats.norm(loc=-2.0)]
    ):
        assert stats.kstest(x[:, i], law.cdf).pvalue > 1e-4
    # Independent components (the two identical Laplace runs must not share a key): sample
    # correlation has SE 1/sqrt(n).
    corr = np.corrcoef(x.T)
    assert abs(corr[0, 1]) < 5 / math.sqrt(n)
    assert abs(corr[0, 2]) < 5 / math.sqrt(n)


@pytest.mark.x64
def test_joint_release_log_density_is_the_sum():
    lap, gau = LaplaceMechanism(epsilon=2.0), GaussianMechanism(sigma=0.7, sensitivity=(1, 1))
    joint = JointRelease(mechanisms=(lap, gau))
    rng = np.random.default_rng(2)
    x = rng.normal(size=(10, 3))
    data = (np.array([0.3]), np.array([1.0, -1.0]))
    expected = stats.laplace.logpdf(x[:, 0], 0.3, 0.5) + stats.norm.logpdf(
        x[:, 1:], [1.0, -1.0], 0.7
    ).sum(1)
    np.testing.assert_allclose(joint.log_density(data, x), expected, rtol=1e-12)


def test_joint_release_rejects_bad_inputs():
    joint = JointRelease(mechanisms=(LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.0)))
    with pytest.raises(InvalidParameterError, match=r"dataset=.*tuple of 2 datasets"):
        joint.sample(KEY, (0.0,), 3)
    with _raises_naming("dataset"):
        joint.sample(KEY, 0.0, 3)
    with _raises_naming("mechanisms"):
        JointRelease(mechanisms=())
    with _raises_naming(r"mechanisms\[1\]"):
        JointRelease(mechanisms=(LaplaceMechanism(epsilon=1.0), "laplace"))


@pytest.mark.x64
def test_post_processing_applies_g():
    lap = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 1.0))
    g = np.array([[1.0, -1.0], [2.0, 0.5], [0.0, 3.0]])
    pp = linear_post_processing(lap, g)
    assert pp.dim == 3
    data = np.array([0.5, 2.0])
    got = np.asarray(pp.sample(KEY, data, 100, dtype=jnp.float64))
    inner = np.asarray(lap.sample(KEY, data, 100, dtype=jnp.float64))
    np.testing.assert_allclose(got, inner @ g.T, rtol=1e-12, atol=1e-12)
    assert pp == linear_post_processing(lap, g.tolist())  # hashable by value
    with pytest.raises(NotImplementedError):
        pp.log_density(data, got)


def test_post_processing_rejects_wrong_shapes():
    lap = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 1.0))
    with _raises_naming("matrix"):
        linear_post_processing(lap, np.eye(3))
    bad = PostProcessed(mechanism=lap, fn=lambda y: y[:, 0], out_dim=1)
    with pytest.raises(InvalidParameterError, match=r"fn=.*shape \(5,\)"):
        bad.sample(KEY, np.zeros(2), 5)


@pytest.mark.x64
def test_black_box_sampler():
    bb = BlackBox(sampler=lambda k, d, n: d + jax.random.normal(k, (n, 2)), dim=2, name="mine")
    direct = 1.0 + jax.random.normal(KEY, (10, 2))  # float64 here (x64 on), op by op
    # sample() runs the sampler compiled, where XLA may round the fused add differently: 1 ulp at most.
    got64 = bb.sample(KEY, 1.0, 10, dtype=jnp.float64)
    np.testing.assert_allclose(got64, direct, rtol=4e-16, atol=4e-16)
    np.testing.assert_allclose(bb.sample(KEY, 1.0, 10), direct, rtol=1.2e-7)  # cast to float32
    assert bb.sample(KEY, 1.0, 10).dtype == jnp.float32
    assert bb.check(KEY, 1.0, 10).shape == (10, 2)
    with pytest.raises(NotImplementedError):
        bb.log_density(1.0, np.zeros((3, 2)))


@pytest.mark.parametrize("jit", [False, True])
def test_black_box_rejects_wrong_shape_and_integer_dtype(jit):
    wrong_shape = BlackBox(sampler=lambda k, d, n: jax.random.normal(k, (n, 3)), dim=2)
    ints = BlackBox(sampler=lambda k, d, n: jax.random.randint(k, (n, 2), 0, 5), dim=2)

    def run(mech):
        if jit:
            return jax.jit(lambda key: mech.sample(key, 0.0, 4))(KEY)
        return mech.sample(KEY, 0.0, 4)

    with pytest.raises(InvalidParameterError, match=r"sampler=.*shape \(4, 2\).*shape \(4, 3\)"):
        run(wrong_shape)
    with pytest.raises(InvalidParameterError, match=r"sampler=.*floating.*int"):
        run(ints)


# --------------------------------------------------------------------------------------------------
# Keys, determinism, jit and scan
# --------------------------------------------------------------------------------------------------


N_SMALL = 16  # one sample size for these tests, so each mechanism's sampler compiles once per dtype


@pytest.mark.parametrize("case", ALL, ids=ALL_IDS)
def test_same_key_same_samples_and_different_keys_differ(case):
    _, mech, data = case
    a = mech.sample(KEY, data, N_SMALL)
    b = mech.sample(KEY, data, N_SMALL)
    assert a.shape == (N_SMALL, mech.dim)
    assert a.dtype == jnp.float32
    np.testing.assert_array_equal(a, b)
    c = mech.sample(jax.random.key(1), data, N_SMALL)
    if isinstance(mech, NonPrivateRelease):
        np.testing.assert_array_equal(a, c)  # deterministic by definition
    else:
        assert not np.array_equal(a, c)


JIT_CASES = [pytest.param(c, None, id=f"{c[0]}-f32") for c in ALL] + [
    pytest.param(c, jnp.float64, id=f"{c[0]}-f64", marks=pytest.mark.x64)
    for c in ALL
    if c[0] in ("laplace", "linear")
]


@pytest.mark.parametrize("case,dtype", JIT_CASES)
def test_sample_under_jit_and_scan_equals_eager(case, dtype):
    """One compiled scan over traced keys covers both jax.jit and lax.scan; results are bit-identical."""
    _, mech, data = case
    keys = jax.random.split(KEY, 3)

    @jax.jit
    def scanned(keys):
        def body(carry, key):
            return carry, mech.sample(key, data, N_SMALL, dtype=dtype)

        return jax.lax.scan(body, None, keys)[1]

    out = scanned(keys)
    eager = np.stack([mech.sample(k, data, N_SMALL, dtype=dtype) for k in keys])
    np.testing.assert_array_equal(out, eager)
    assert out.dtype == (jnp.float32 if dtype is None else jnp.float64)


def test_mechanisms_are_hashable_static_jit_arguments():
    def draw(mech, key):
        return mech.sample(key, jnp.zeros(1), 5)

    draw = jax.jit(chex.assert_max_traces(draw, n=1), static_argnums=0)
    a = draw(LaplaceMechanism(epsilon=1.0), KEY)
    b = draw(LaplaceMechanism(epsilon=1, sensitivity=[1]), KEY)  # equal value: no retrace
    np.testing.assert_array_equal(a, b)
    assert hash(MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=1.0)) == hash(
        MatrixMechanism(workload=np.array(W_EX), strategy=np.array(A_EX), epsilon=1)
    )


@pytest.mark.x64
def test_dtype_handling():
    lap = LaplaceMechanism(epsilon=1.0)
    assert lap.sample(KEY, 0.0, 3).dtype == jnp.float32  # float32 by default, even with x64 on
    assert lap.sample(KEY, 0.0, 3, dtype=jnp.float64).dtype == jnp.float64
    with _raises_naming("dtype"):
        lap.sample(KEY, 0.0, 3, dtype=jnp.int32)
    with jax.enable_x64(False):
        with pytest.raises(InvalidParameterError, match=r"dtype=.*jax_enable_x64"):
            lap.sample(KEY, 0.0, 3, dtype=jnp.float64)
        assert lap.sample(KEY, 0.0, 3).dtype == jnp.float32


# --------------------------------------------------------------------------------------------------
# Neighbouring pairs
# --------------------------------------------------------------------------------------------------


def test_canonical_pairs_of_builtin_mechanisms():
    lap = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 2.0))
    pair = canonical_pair(lap)
    np.testing.assert_array_equal(pair.dataset, [0.0, 0.0])
    np.testing.assert_array_equal(pair.neighbour, [1.0, 2.0])
    rr_pair = canonical_pair(RandomizedResponse(epsilon=1.0, k=3))
    assert (rr_pair.dataset, rr_pair.neighbour) == (0, 1)
    mm_pair = canonical_pair(MatrixMechanism(workload=W_EX, strategy=A_EX, epsilon=1.0))
    np.testing.assert_array_equal(mm_pair.dataset, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(mm_pair.neighbour, [1.0, 0.0, 0.0])
    np_pair = canonical_pair(NonPrivateRelease(dim=2))
    np.testing.assert_array_equal(np_pair.neighbour, [1.0, 1.0])
    mix = Mixture(first=lap, second=GaussianMechanism(sigma=1.0, sensitivity=(1, 2)), weight=0.5)
    np.testing.assert_array_equal(canonical_pair(mix).neighbour, [1.0, 2.0])
    pp_pair = canonical_pair(linear_post_processing(lap, [[1.0, 1.0]]))
    np.testing.assert_array_equal(pp_pair.neighbour, [1.0, 2.0])
    joint_pair = canonical_pair(JointRelease(mechanisms=(lap, RandomizedResponse(epsilon=1.0))))
    assert joint_pair.neighbour[1] == 1
    np.testing.assert_array_equal(joint_pair.neighbour[0], [1.0, 2.0])
    np.testing.assert_array_equal(joint_pair.dataset[0], [0.0, 0.0])


def test_canonical_pair_refuses_what_it_cannot_define():
    with _raises_naming("mechanism"):
        canonical_pair(BlackBox(sampler=lambda k, d, n: jax.random.normal(k, (n, 1)), dim=1))
    with _raises_naming("mechanism"):
        canonical_pair(LaplaceMechanism(epsilon=1.0, query=lambda d: d[:1]))
    with _raises_naming("mechanism"):
        canonical_pair(
            Mixture(
                first=LaplaceMechanism(epsilon=1.0),
                second=LaplaceMechanism(epsilon=1.0, sensitivity=(2.0,)),
                weight=0.5,
            )
        )


@pytest.mark.x64
def test_neighbouring_pair_sampling():
    sens = np.array([1.0, 2.0])
    pair = canonical_pair(GaussianMechanism(sigma=1.0, sensitivity=sens))
    n = 50_000
    p, q = pair.sample(KEY, n, dtype=jnp.float64)
    assert p.shape == q.shape == (n, 2)
    # P centred at 0, Q at v; mean SE 1/sqrt(n).
    np.testing.assert_array_less(np.abs(np.asarray(p).mean(0)), 5 / math.sqrt(n))
    np.testing.assert_array_less(np.abs(np.asarray(q).mean(0) - sens), 5 / math.sqrt(n))
    # Independent draws for P and Q: correlation SE 1/sqrt(n).
    assert abs(np.corrcoef(p[:, 0], q[:, 0])[0, 1]) < 5 / math.sqrt(n)
    fast = pair.sampler(n, dtype=jnp.float64)
    p2, q2 = fast(KEY)
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(q, q2)
    back = pair.swapped()
    np.testing.assert_array_equal(back.dataset, pair.neighbour)
    np.testing.assert_array_equal(back.neighbour, pair.dataset)
    # A point-mass pair really is two point masses.
    pn, qn = canonical_pair(NonPrivateRelease()).sample(KEY, 4)
    np.testing.assert_array_equal(pn, 0.0)
    np.testing.assert_array_equal(qn, 1.0)


def test_neighbouring_pair_checks_its_datasets():
    lap = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 1.0))
    with _raises_naming("dataset"):
        NeighbouringPair(lap, np.zeros(2), np.zeros(3))
    with _raises_naming("mechanism"):
        NeighbouringPair("laplace", 0.0, 1.0)


# --------------------------------------------------------------------------------------------------
# Factory and validation
# --------------------------------------------------------------------------------------------------


def test_make_mechanism_builds_each_name():
    assert MECHANISM_NAMES == (
        "laplace",
        "gaussian",
        "randomized_response",
        "nonprivate",
        "subsampled_gaussian",
    )
    lap = make_mechanism("laplace", epsilon=0.5, sensitivity=[1, 2], sigma=None, k=None)
    assert lap == LaplaceMechanism(epsilon=0.5, sensitivity=(1.0, 2.0))
    assert make_mechanism("gaussian", sigma=2.0) == GaussianMechanism(sigma=2.0)
    assert make_mechanism("randomized_response", epsilon=1.0, k=5) == RandomizedResponse(
        epsilon=1.0, k=5
    )
    nonprivate = make_mechanism("nonprivate", sensitivity=(1, 1))
    assert nonprivate == NonPrivateRelease(dim=2) and isinstance(nonprivate, Mechanism)


def test_make_mechanism_errors():
    with pytest.raises(InvalidParameterError, match=r"mechanism='cauchy'.*'laplace', 'gaussian'"):
        make_mechanism("cauchy", epsilon=1.0)
    with _raises_naming("sigma"):
        make_mechanism("laplace", epsilon=1.0, sigma=2.0)
    with pytest.raises(InvalidParameterError, match=r"epsilon=None.*must be given"):
        make_mechanism("laplace", sensitivity=(1.0,))
    with _raises_naming("epsilon"):
        make_mechanism("randomized_response", epsilon=-1.0)


BAD_CONSTRUCTORS = [
    ("epsilon", lambda: LaplaceMechanism(epsilon=0.0)),
    ("epsilon", lambda: LaplaceMechanism(epsilon=-1.0)),
    ("epsilon", lambda: LaplaceMechanism(epsilon=float("nan"))),
    ("epsilon", lambda: LaplaceMechanism(epsilon=float("inf"))),
    ("sigma", lambda: GaussianMechanism(sigma=0.0)),
    ("sigma", lambda: GaussianMechanism(sigma=-2.0)),
    ("sensitivity", lambda: LaplaceMechanism(epsilon=1.0, sensitivity=(-1.0,))),
    ("sensitivity", lambda: GaussianMechanism(sigma=1.0, sensitivity=(1.0, float("nan")))),
    ("sensitivity", lambda: LaplaceMechanism(epsilon=1.0, sensitivity=())),
    ("query", lambda: LaplaceMechanism(epsilon=1.0, query=3)),
    ("k", lambda: RandomizedResponse(epsilon=1.0, k=1)),
    ("k", lambda: RandomizedResponse(epsilon=1.0, k=2.5)),
    ("epsilon", lambda: RandomizedResponse(epsilon=0.0)),
    (
        "weight",
        lambda: Mixture(
            first=LaplaceMechanism(epsilon=1.0), second=LaplaceMechanism(epsilon=1.0), weight=-0.1
        ),
    ),
    (
        "weight",
        lambda: Mixture(
            first=LaplaceMechanism(epsilon=1.0), second=LaplaceMechanism(epsilon=1.0), weight=1.5
        ),
    ),
    (
        "weight",
        lambda: Mixture(
            first=LaplaceMechanism(epsilon=1.0),
            second=LaplaceMechanism(epsilon=1.0),
            weight=float("nan"),
        ),
    ),
    (
        "second",
        lambda: Mixture(
            first=LaplaceMechanism(epsilon=1.0),
            second=LaplaceMechanism(epsilon=1.0, sensitivity=(1, 1)),
            weight=0.5,
        ),
    ),
    ("first", lambda: Mixture(first=None, second=LaplaceMechanism(epsilon=1.0), weight=0.5)),
    ("dim", lambda: BlackBox(sampler=lambda k, d, n: d, dim=0)),
    ("sampler", lambda: BlackBox(sampler=3, dim=1)),
    ("out_dim", lambda: PostProcessed(mechanism=NonPrivateRelease(), fn=_shift, out_dim=0)),
    ("sensitivity", lambda: NonPrivateRelease(dim=2, sensitivity=(1.0, 2.0, 3.0))),
]


@pytest.mark.parametrize("name,build", BAD_CONSTRUCTORS)
def test_bad_parameters_raise_naming_the_parameter(name, build):
    with _raises_naming(name):
        build()


BAD_CALLS = [
    # wrong sensitivity length vs the dataset (the query answer)
    (
        "dataset",
        lambda: LaplaceMechanism(epsilon=1.0, sensitivity=(1, 1)).sample(KEY, np.zeros(3), 4),
    ),
    ("dataset", lambda: GaussianMechanism(sigma=1.0).sample(KEY, np.zeros((1, 1)), 4)),
    ("dataset", lambda: RandomizedResponse(epsilon=1.0, k=4).sample(KEY, 4, 4)),
    ("dataset", lambda: RandomizedResponse(epsilon=1.0, k=4).sample(KEY, -1, 4)),
    ("dataset", lambda: RandomizedResponse(epsilon=1.0).sample(KEY, 1.0, 4)),
    (
        "dataset",
        lambda: Mixture(
            first=RandomizedResponse(epsilon=1.0),
            second=RandomizedResponse(epsilon=2.0),
            weight=0.5,
        ).sample(KEY, 2, 4),
    ),
    ("n", lambda: LaplaceMechanism(epsilon=1.0).sample(KEY, 0.0, 0)),
    ("n", lambda: LaplaceMechanism(epsilon=1.0).sample(KEY, 0.0, 2.5)),
    ("key", lambda: LaplaceMechanism(epsilon=1.0).sample(0, 0.0, 3)),
    ("x", lambda: LaplaceMechanism(epsilon=1.0).log_density(0.0, np.zeros((3, 2)))),
    ("x", lambda: RandomizedResponse(epsilon=1.0, k=3).log_density(0, np.zeros(3))),
]


@pytest.mark.parametrize("name,call", BAD_CALLS)
def test_bad_calls_raise_naming_the_parameter(name, call):
    with _raises_naming(name):
        call()


def test_nonprivate_release_has_no_density():
    with pytest.raises(NotImplementedError, match="point mass"):
        NonPrivateRelease().log_density(0.0, np.zeros((2, 1)))


@pytest.mark.x64
def test_canonical_pair_from_uniforms_has_the_mechanisms_laws():
    """The sweep's sampler (moved here): P = M(0), Q = M(v) with the right scale for both families."""
    from cbdp_jax._src.mechanisms import canonical_pair_from_uniforms, pair_uniforms

    u = pair_uniforms(jax.random.key(3), 200_000, 1, np.float64)
    for family, scale, sd in (("laplace", 0.5, 0.5 * math.sqrt(2.0)), ("gaussian", 2.0, 2.0)):
        x = np.asarray(canonical_pair_from_uniforms(u, family=family, noise_scale=scale,
                                                    sensitivity=np.array([1.5])))  # fmt: skip
        # 200k draws: mean to about sd / 450, sd to about 0.3% (Laplace kurtosis 6): 5 SE bounds.
        np.testing.assert_allclose(x.mean(axis=(1, 2)), [0.0, 1.5], atol=5 * sd / 447)
        np.testing.assert_allclose(x.std(axis=(1, 2)), [sd, sd], rtol=0.012)
    mixed = canonical_pair_from_uniforms(u, family="mixed", gaussian=True, noise_scale=2.0,
                                         sensitivity=np.array([1.5]))  # fmt: skip
    gauss = canonical_pair_from_uniforms(u, family="gaussian", noise_scale=2.0,
                                         sensitivity=np.array([1.5]))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(mixed), np.asarray(gauss))
