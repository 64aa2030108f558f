"""The empirical estimator against exact restricted values and its own contracts.

Tolerances: a held-out estimate is the f-form of one trained h, so E[estimate] = objective(h) <= D^H. Its
deviation from the exact value is sampling noise (the reported standard error, SE) plus an optimisation
gap >= 0. We allow 4 SE (a 4-sigma two-sided band: a correct estimator leaves it with probability
< 1e-4) plus a small optimisation allowance stated per test, with enough held-out samples that the
whole band is narrower than 5% of the value: ``_assert_two_sided`` also checks that the same estimate
moved by a planted 5% bias (either way) would have failed, so a biased or in-sample estimator cannot
pass. Statements about the 95% bound are made at level 0.999 (a correct bound fails them with
probability <= 0.1%), never as one 95% draw.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax.estimator import EstimatorConfig, estimate, estimate_from_samples
from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism, NonPrivateRelease

# Exact restricted values (closed forms; checked against an independent scipy optimisation in
# tests/test_exact_independent.py): (lin, KL) = a + log(1 - a^2), a = sqrt(2) - 1, at eps = 1.
LIN_KL_LAPLACE_1 = 0.225987
LIN_RENYI4_LAPLACE_1 = 0.410577
KL_GAUSSIAN_1 = 0.5  # (lin, KL) = KL = 1 / (2 sigma^2)

FAST = EstimatorConfig(steps=600, eval_every=100, ensemble=2, batch_size=2048)
# Many held-out samples (70% of the arrays) and a 0.999-level bound for the accuracy tests.
ACCURATE = dataclasses.replace(FAST, split=(0.2, 0.1, 0.7), confidence=0.999)


def _laplace_samples(seed, n, shift=1.0):
    rng = np.random.default_rng(seed)
    return rng.laplace(0.0, 1.0, n), rng.laplace(shift, 1.0, n)


def _assert_two_sided(res, truth: float, allowance: float) -> None:
    """|estimate - truth| <= 4 SE + allowance, and a planted 5% bias either way would fail that."""
    tol = 4 * res.std_error + allowance
    assert abs(res.estimate - truth) <= tol, (res.estimate, truth, tol)
    for planted in (1.05, 0.95):  # the negative control: the tolerance rejects a 5% bias
        assert abs(planted * res.estimate - truth) > tol, (planted, res.estimate, truth, tol)


def test_linear_kl_laplace_matches_exact_value():
    assert LIN_KL_LAPLACE_1 == pytest.approx(
        math.sqrt(2) - 1 + math.log(1 - (math.sqrt(2) - 1) ** 2), abs=1e-6
    )
    # exp(h) under Q has tail index 2.41 here, so the SE shrinks slowly: 2 million held-out samples
    # per side (streamed in chunks) make the 4-SE band about 2% of the value.
    res = estimate(
        jax.random.key(0),
        LaplaceMechanism(epsilon=1.0),
        samples=60_000,
        test_samples=2_000_000,
        adversary="linear",
        config=dataclasses.replace(FAST, confidence=0.999),
    )
    assert res.objective == "dv"
    # 0.002 optimisation allowance: DV on a 2-parameter concave problem from 60,000 training samples
    # (the slope's error ~ 1/sqrt(n) costs a second-order ~1e-5 of value).
    _assert_two_sided(res, LIN_KL_LAPLACE_1, 0.002)
    assert res.lower_bound <= LIN_KL_LAPLACE_1
    assert res.samples["test_p"] == 2_000_000 and res.samples["train_p"] == 60_000


@pytest.mark.slow
@pytest.mark.ci
def test_linear_renyi_laplace_matches_exact_value():
    p, q = _laplace_samples(1, 300_000)
    res = estimate_from_samples(
        jax.random.key(1), p, q, adversary="linear", divergence="renyi", alpha=4.0, config=ACCURATE
    )
    assert res.objective == "renyi_scale_free"
    assert res.samples["test_p"] == 210_000 and res.samples["train_p"] == 60_000
    _assert_two_sided(res, LIN_RENYI4_LAPLACE_1, 0.004)
    assert res.lower_bound <= LIN_RENYI4_LAPLACE_1


@pytest.mark.slow
@pytest.mark.ci
def test_gaussian_linear_kl_from_mechanism_entry():
    res = estimate(
        jax.random.key(2),
        GaussianMechanism(sigma=1.0),
        samples=40_000,
        test_samples=1_000_000,
        adversary="linear",
        config=dataclasses.replace(FAST, confidence=0.999),
    )
    _assert_two_sided(res, KL_GAUSSIAN_1, 0.002)
    assert res.lower_bound <= KL_GAUSSIAN_1


def test_fresh_samples_training_matches_exact_value():
    res = estimate(
        jax.random.key(3),
        LaplaceMechanism(epsilon=1.0),
        samples=20_000,
        test_samples=2_000_000,
        fresh_samples=True,
        adversary="linear",
        config=FAST,
    )
    assert res.samples["train_p"] == FAST.steps * FAST.batch_size
    _assert_two_sided(res, LIN_KL_LAPLACE_1, 0.002)


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_estimate_is_held_out_not_in_sample(seed):
    """P = Q, so D^H = 0 for every class. A wide MLP trained on 240 samples per side finds spurious
    structure in them: its training objective climbs while its validation objective falls.

    The reported estimate must stay below 3 SE (one-sided: E[estimate] = v(h) <= D^H = 0), and the
    finite-sample bound, certified at level 0.999, must not exceed 0 (a correct bound exceeds it with
    probability <= 0.1%; over the four seeds <= 0.4%). The negative control is the best training
    objective of the same run (``curves['train_objective']``, in-sample): an estimator that reported it
    would fail the first assertion, so it lies far above. Four seeds, not one: the selected critic's own
    in-sample value (``train_value``) depends on which validation block wins and is near the estimate in
    some seeds (seeds 0-3 and 7 of 0-7 on a CPU, and seed 4 on an H100 with TF32 products), so the
    control is the training curve, positive in every seed."""
    rng = np.random.default_rng(4)
    p, q = rng.laplace(size=8000), rng.laplace(size=8000)
    cfg = EstimatorConfig(
        steps=1000,
        eval_every=100,
        ensemble=2,
        batch_size=None,
        learning_rate=3e-2,
        split=(0.03, 0.03, 0.94),
        guarantee="finite-sample",
        confidence=0.999,
    )
    res = estimate_from_samples(
        jax.random.key(seed), p, q, adversary="mlp", width=64, depth=2, config=cfg
    )
    assert res.estimate < 3 * res.std_error
    in_sample = max(res.curves["train_objective"])
    assert in_sample > 3 * res.std_error and in_sample > res.estimate + 5 * res.std_error
    assert res.bound_reliable and res.f_lower_bound <= 0.0


def test_same_key_gives_bit_identical_results():
    p, q = _laplace_samples(5, 8_000)
    a = estimate_from_samples(jax.random.key(7), p, q, adversary="poly", degree=2, config=FAST)
    b = estimate_from_samples(jax.random.key(7), p, q, adversary="poly", degree=2, config=FAST)
    c = estimate_from_samples(jax.random.key(8), p, q, adversary="poly", degree=2, config=FAST)
    for field in ("estimate", "lower_bound", "std_error", "train_value", "curves"):
        assert getattr(a, field) == getattr(b, field)
    assert a.estimate != c.estimate


def test_point_mass_release_is_infinite_with_reason():
    cfg = EstimatorConfig(steps=100, ensemble=1, both_directions=True)
    res = estimate(
        jax.random.key(0), NonPrivateRelease(dim=1), samples=1000, adversary="linear", config=cfg
    )
    assert res.unbounded and res.estimate == math.inf and res.lower_bound == math.inf
    assert "Lemma 2" in res.reason
    assert res.max_lower_bound == math.inf
    assert '"inf"' in res.to_json() and "NaN" not in res.to_json()


@pytest.mark.slow
@pytest.mark.ci
def test_identical_distributions_bound_covers_zero():
    rng = np.random.default_rng(9)
    p, q = rng.normal(size=20_000), rng.normal(size=20_000)
    res = estimate_from_samples(jax.random.key(9), p, q, adversary="poly", degree=2, config=FAST)
    # D^H(P, P) = 0; the held-out estimate of 0 has noise SE, so 4 SE covers it.
    assert abs(res.estimate) < 4 * res.std_error + 1e-3
    assert res.f_lower_bound <= 0.0 and res.lower_bound == 0.0


def test_both_directions_and_bonferroni_bound():
    cfg = EstimatorConfig(steps=400, ensemble=2, batch_size=2048, both_directions=True)
    res = estimate(
        jax.random.key(10),
        LaplaceMechanism(epsilon=1.0),
        samples=30_000,
        adversary="linear",
        config=cfg,
    )
    assert res.reverse is not None and res.reverse.direction == "QP"
    # Laplace shift pair is symmetric: both directions estimate the same 0.225987.
    both_se = math.hypot(res.std_error, res.reverse.std_error)
    assert abs(res.estimate - res.reverse.estimate) < 4 * both_se + 0.01
    assert res.max_estimate == max(res.estimate, res.reverse.estimate)
    # a level 1 - delta/2 bound is lower than the level 1 - delta bound of the same direction
    assert res.max_lower_bound <= max(res.lower_bound, res.reverse.lower_bound)


def test_second_call_with_same_shapes_does_not_recompile(max_traces):
    from cbdp_jax._src.estimator import adversary_fitting, evaluation

    p, q = _laplace_samples(11, 4_000)
    cfg = EstimatorConfig(steps=200, ensemble=2, batch_size=512)
    estimate_from_samples(jax.random.key(0), p, q, adversary="linear", config=cfg)
    max_traces(adversary_fitting, "_train_body", 0)
    max_traces(evaluation, "_chunk_body", 0)
    estimate_from_samples(jax.random.key(1), p + 0.1, q, adversary="linear", config=cfg)


def test_a_new_step_count_or_sample_size_does_not_retrace_the_training(max_traces):
    """The step count, the evaluation interval and the patience are run-time bounds of one training
    program, and the training arrays are padded to a bucket: none of them retraces it."""
    from cbdp_jax._src.estimator import adversary_fitting

    p, q = _laplace_samples(13, 4_000)
    cfg = EstimatorConfig(steps=200, ensemble=2, batch_size=512)
    estimate_from_samples(jax.random.key(0), p, q, adversary="linear", config=cfg)
    max_traces(adversary_fitting, "_train_body", 0)
    other = dataclasses.replace(cfg, steps=300, eval_every=30, patience=3)
    estimate_from_samples(jax.random.key(1), p, q, adversary="linear", config=other)


def test_the_trace_guard_catches_a_retrace(max_traces):
    """Negative control: a new minibatch size (a shape) retraces, and the guard above says so."""
    from cbdp_jax._src.estimator import adversary_fitting

    p, q = _laplace_samples(13, 4_000)
    cfg = EstimatorConfig(steps=200, ensemble=2, batch_size=512)
    estimate_from_samples(jax.random.key(0), p, q, adversary="linear", config=cfg)
    max_traces(adversary_fitting, "_train_body", 0)
    with pytest.raises(AssertionError, match="traced > 0 times"):
        estimate_from_samples(
            jax.random.key(1), p, q, adversary="linear",
            config=dataclasses.replace(cfg, batch_size=256),
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.x64
def test_float64_and_lbfgs_linear_class():
    p, q = _laplace_samples(12, 40_000)
    cfg = EstimatorConfig(steps=100, eval_every=10, ensemble=2, optimizer="lbfgs", dtype="float64")
    res = estimate_from_samples(jax.random.key(12), p, q, adversary="linear", config=cfg)
    assert abs(res.estimate - LIN_KL_LAPLACE_1) < 4 * res.std_error + 0.002


@pytest.mark.slow
@pytest.mark.ci
def test_progress_callback_counts_steps_and_blocks_up_to_the_budget():
    seen = []
    cfg = EstimatorConfig(
        steps=300, eval_every=100, ensemble=1, patience=None, progress=seen.append
    )
    p, q = _laplace_samples(13, 2_000)
    estimate_from_samples(jax.random.key(0), p, q, adversary="linear", config=cfg)
    # One call per compiled segment: steps done rise to the budget, blocks to its three checks.
    steps = [s.step for s in seen]
    assert steps == sorted(steps) and steps[-1] == 300 and len(set(steps)) == len(steps)
    assert all(s.steps == 300 and s.blocks == 3 and s.block == s.step // 100 for s in seen)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p_samples": np.array([1.0, np.nan] * 50)}, "p_samples"),
        ({"q_samples": np.ones((100, 2))}, "dimension"),
        ({"p_samples": np.ones(5)}, "p_samples"),
        ({"adversary": "transformer"}, "adversary"),
        ({"divergence": "renyi", "alpha": 0.5}, "alpha"),
        ({"divergence": "renyi", "alpha": 1.0}, "KL"),
        ({"divergence": "wasserstein"}, "divergence"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, match):
    args = {
        "p_samples": np.linspace(-1, 1, 100),
        "q_samples": np.linspace(0, 2, 100),
        "adversary": "linear",
    }
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        estimate_from_samples(
            jax.random.key(0), args.pop("p_samples"), args.pop("q_samples"), config=FAST, **args
        )


def test_untyped_key_is_rejected():
    with pytest.raises(InvalidParameterError, match="key"):
        estimate_from_samples(jax.random.PRNGKey(0), np.ones(100), np.ones(100))


@pytest.mark.parametrize(
    "kwargs", [{"steps": 0}, {"confidence": 1.0}, {"split": (0.5, 0.5, 0.1)}, {"optimizer": "sgd"}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(InvalidParameterError):
        EstimatorConfig(**kwargs)


# ---------------------------------------------------------------------------------------------------
# Slow: the accuracy claims at 10^6 samples and the capacity gap closing.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("mech", ["laplace", "gaussian"])
@pytest.mark.parametrize("div,alpha,rel", [("kl", None, 0.01), ("renyi", 4.0, 0.03)])
@pytest.mark.parametrize("adversary,degree", [("linear", 1), ("poly", 2), ("poly", 3)])
def test_million_sample_accuracy_against_exact(mech, div, alpha, rel, adversary, degree):
    """The issue's claim: at 10^6 samples, within 1% (KL) / 3% (Renyi-4) of the exact value, with the
    95% lower bound below it. Relative tolerances: the SE at 10^6 samples is ~0.5% of the value
    (benchmarks/accuracy.py), so 1% is 2 SE and 3% is ~6 SE."""
    from cbdp_jax import exact

    pair = exact.laplace_pair(1.0) if mech == "laplace" else exact.gaussian_pair(1.0)
    truth = exact.restricted_divergence(pair, div, adversary, degree=degree, alpha=alpha).value
    m = LaplaceMechanism(epsilon=1.0) if mech == "laplace" else GaussianMechanism(sigma=1.0)
    # guarantee='class': the bound is compared with D^H of this class, so it must be a bound on it
    # (auto's finite-sample fallback bounds B tanh(H / B), which exceeds D^H for poly Renyi here).
    cfg = EstimatorConfig(steps=2000, ensemble=4, batch_size=8192, guarantee="class")
    res = estimate(
        jax.random.key(21),
        m,
        samples=1_000_000,
        adversary=adversary,
        degree=degree if adversary == "poly" else None,
        divergence=div,
        alpha=alpha,
        config=cfg,
    )
    if mech == "laplace" and div == "kl" and degree == 3:
        # (poly_3, KL) = (poly_2, KL) for Laplace: any cubic term makes E_Q[exp h] infinite, so the
        # exact optimum has none (docs/theory/mechanisms.md), but a trained cubic coefficient is never exactly
        # 0 and f*(h) = exp(h - 1) then has infinite mean under Q. No finite sample certifies that
        # estimate; what must hold is that the result says so (or happens to be accurate).
        flagged = (not res.bound_reliable) or any("heavy tail" in w for w in res.warnings)
        assert flagged or abs(res.estimate - truth) <= rel * truth
        assert res.lower_bound <= truth
        return
    assert abs(res.estimate - truth) <= rel * truth, (res.estimate, truth)
    assert res.lower_bound <= truth


@pytest.mark.slow
@pytest.mark.ci
def test_mlp_closes_the_capacity_gap_for_laplace_kl():
    truth = 1.0 - 1.0 + math.exp(-1.0)  # eps - 1 + e^-eps at eps = 1
    cfg = EstimatorConfig(steps=3000, ensemble=4, batch_size=4096, learning_rate=3e-3)
    res = estimate(
        jax.random.key(22),
        LaplaceMechanism(epsilon=1.0),
        samples=400_000,
        adversary="mlp",
        width=64,
        depth=2,
        config=cfg,
    )
    assert res.estimate >= 0.97 * truth
    assert res.lower_bound <= truth
