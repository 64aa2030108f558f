"""DP training runs as a mechanism: samplers, the vmapped engine, the gradient canary's exact law, and
audits of correct and bugged DP-SGD (cbdp_jax.training_audit; docs/theory/training_audit.md)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from cbdp_jax import InvalidParameterError
from cbdp_jax import training_audit as ta

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

# A small synthetic problem: 31 examples + the canary, logistic regression, 8 Poisson steps at q = 1/8.
SMALL = dict(data="synthetic", n=31, sampler="poisson", rate=0.125, steps=8, noise=1.0, chunk=4096)
RUNS = (
    4000  # runs per side: every test of SMALL uses this count, so they share one compiled program
)


@pytest.fixture(scope="module")
def small():
    problem = ta.build_problem(**SMALL)
    return problem, ta.prepare(problem, noise_probes=False)


# --- samplers -----------------------------------------------------------------------------------


def test_poisson_masks_include_each_example_at_the_rate_independently():
    n, steps, q = 40, 2000, 0.2
    masks = np.asarray(ta.BatchSampler(kind="poisson", rate=q).masks(jax.random.key(0), n, steps))
    # 80,000 Bernoulli(0.2): the overall rate within 5 standard errors, every example's within 5
    se = math.sqrt(q * (1 - q) / masks.size)
    assert abs(masks.mean() - q) < 5 * se
    assert np.all(np.abs(masks.mean(0) - q) < 5 * math.sqrt(q * (1 - q) / steps))
    # independent of the step before: P(in at t and t+1) = q^2
    both = (masks[1:] & masks[:-1]).mean()
    assert abs(both - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / masks[1:].size)


def test_shuffle_masks_cover_each_example_once_per_epoch():
    n, b, epochs = 12, 3, 5
    sampler = ta.BatchSampler(kind="shuffle", batch_size=b)
    masks = np.asarray(sampler.masks(jax.random.key(1), n, epochs * n // b))
    assert np.all(masks.sum(1) == b)
    per_epoch = masks.reshape(epochs, n // b, n).sum(1)
    assert np.all(per_epoch == 1)
    # and the epochs are different permutations
    assert len({tuple(np.argmax(masks[e * 4 : e * 4 + 4], 0)) for e in range(epochs)}) > 1


def test_fixed_size_masks_have_exactly_b_uniform_members():
    n, b, steps = 10, 4, 3000
    masks = np.asarray(
        ta.BatchSampler(kind="fixed", batch_size=b).masks(jax.random.key(2), n, steps)
    )
    assert np.all(masks.sum(1) == b)
    se = math.sqrt(0.4 * 0.6 / steps)
    assert np.all(np.abs(masks.mean(0) - b / n) < 5 * se)


# --- the engine -----------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["dp-sgd", "optax"])
def test_vmapped_runs_equal_a_python_loop_of_the_same_runs(small, step):
    # dp-sgd: the RUNS-run program the audits below reuse; optax.contrib.dpsgd: a 5-run program
    problem, prep = small
    n = RUNS
    if step == "optax":
        problem = ta.build_problem(**(SMALL | {"step": step}))
        prep, n = ta.prepare(problem), 5
    key = jax.random.key(7)
    many = ta.training_runs(key, problem, n, prep=prep)
    run = jax.jit(ta.make_run(problem, prep))
    for i, k in enumerate(jax.random.split(key, n)[:5]):
        one = run(k, jnp.float32(1.0))
        np.testing.assert_allclose(np.asarray(one.z), many.z[i], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(float(one.score), many.score[i], rtol=1e-6, atol=1e-6)
    # the runs differ from each other: the step's noise key is re-seeded per run
    assert len(set(np.round(many.score[:5], 6))) == 5


def test_gradient_canary_scores_have_the_subsampled_gaussian_law(small):
    # Each step's canary coordinate, in canary units, is Bernoulli(q) + N(0, S^2) on D and N(0, S^2)
    # on D', independently over steps: exact.subsampled_gaussian_pair's two laws. 4000 runs x 8
    # steps = 32,000 draws per side, compared (two-sample KS) with 32,000 draws of the library's
    # SubsampledGaussianMechanism and (one-sample KS) with the closed-form CDF. Fixed seeds; at level
    # 1e-3 a correct law fails by chance once in a thousand seeds, while a wrong q (0.125 -> 0.1) and
    # S (1 -> 1.1) move the CDF by > 0.02, above KS's critical value at 1e-3 (1.95 / sqrt(n) = 0.011).
    from cbdp_jax.exact import subsampled_gaussian_pair

    problem, prep = small
    assert prep.law_exact  # the canary coordinate is the weight of the always-zero feature
    z_in = ta.training_runs(jax.random.key(11), problem, RUNS, prep=prep).z.ravel()
    z_out = ta.training_runs(jax.random.key(12), problem, RUNS, canary=False, prep=prep).z.ravel()
    pair = subsampled_gaussian_pair(1.0, 0.125)
    ref_in = np.asarray(pair.mechanism.sample(jax.random.key(13), pair.dataset, z_in.size)).ravel()
    ref_out = np.asarray(
        pair.mechanism.sample(jax.random.key(14), pair.neighbour, z_in.size)
    ).ravel()
    q = 0.125
    mixture = lambda v: (1 - q) * stats.norm.cdf(v) + q * stats.norm.cdf(v - 1.0)
    assert stats.kstest(z_in, mixture).pvalue > 1e-3
    assert stats.kstest(z_out, stats.norm.cdf).pvalue > 1e-3
    assert stats.ks_2samp(z_in, ref_in).pvalue > 1e-3
    assert stats.ks_2samp(z_out, ref_out).pvalue > 1e-3
    # and the KS test has the power the comparison needs: a wrong rate is rejected
    wrong = lambda v: 0.9 * stats.norm.cdf(v) + 0.1 * stats.norm.cdf(v - 1.0)
    assert stats.kstest(z_in, lambda v: wrong(v / 1.1)).pvalue < 1e-3


def test_a_custom_score_is_a_function_of_the_canary_coordinates(small):
    problem, prep = small
    custom = dataclasses.replace(problem, score=lambda z: jnp.sum(z**2))
    out = ta.training_runs(jax.random.key(3), custom, 50, prep=prep)
    np.testing.assert_allclose(out.score, (out.z**2).sum(1), rtol=1e-5)
    assert custom.score_kind() == "custom"


@pytest.mark.parametrize("threat", ["white-box", pytest.param("black-box", marks=pytest.mark.slow)])
def test_input_canary_scores_are_larger_when_the_canary_was_trained_on(threat):
    # The final parameters' move along the canary's negative gradient (white-box) and minus its final
    # loss (black-box) grow when the canary is in; at S = 0.5 the means differ by about 5.7 standard
    # errors at 1000 runs per side (measured once), so > 3 leaves room for the seed.
    problem = ta.build_problem(**(SMALL | {"threat": threat, "noise": 0.5}))
    assert problem.canary.kind == "input"
    prep = ta.prepare(problem)
    a = ta.training_runs(jax.random.key(0), problem, 1000, prep=prep).score
    b = ta.training_runs(jax.random.key(1), problem, 1000, canary=False, prep=prep).score
    assert (a.mean() - b.mean()) / math.sqrt(a.var() / 1000 + b.var() / 1000) > 3.0


# --- audits ---------------------------------------------------------------------------------------


def test_a_correct_dpsgd_run_is_not_flagged_at_its_accountant_claim(small):
    problem, _ = small
    config = ta.training_audit_config(ta_claim_eps(problem), samples=RUNS)
    for seed in (0, 1):
        result = ta.audit_training(jax.random.key(seed), problem, config=config)
        assert not result.violation, result.verdict
        assert result.empirical.epsilon <= result.claimed["epsilon"]
        assert result.claimed["source"]["sampling"] == "poisson"


def test_noise_added_after_averaging_is_certified(small):
    problem, _ = small
    bugged = ta.build_problem(**(SMALL | {"bug": "noise-after-averaging"}))
    config = ta.training_audit_config(ta_claim_eps(problem), samples=RUNS)
    result = ta.audit_training(jax.random.key(0), bugged, config=config)
    assert result.violation
    assert result.empirical.epsilon > 1.0


def ta_claim_eps(problem) -> float:
    from cbdp_jax.audit import parse_claim

    return parse_claim(ta.default_claim(problem)).epsilon


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_raises_one_line_errors_naming_the_parameter(small):
    problem, _ = small
    with pytest.raises(InvalidParameterError, match="step=.*GradientTransformation"):
        dataclasses.replace(problem, step=lambda g: g)
    canary = ta.Canary(kind="input", x=np.zeros(3), y=0)
    with pytest.raises(InvalidParameterError, match="canary x of shape"):
        dataclasses.replace(problem, canary=canary, threat="black-box")
    with pytest.raises(InvalidParameterError, match="canary='gradient' is invalid"):
        dataclasses.replace(problem, threat="white-box")
    for rate in (0.0, 1.5, -0.1):
        with pytest.raises(InvalidParameterError, match="rate="):
            ta.BatchSampler(kind="poisson", rate=rate)
    with pytest.raises(InvalidParameterError, match="batch_size=40"):
        ta.build_problem(**(SMALL | {"sampler": "shuffle", "batch_size": 40}))
    with pytest.raises(InvalidParameterError, match="training audit checks"):
        ta.audit_training(jax.random.key(0), problem, "renyi:2:1")
    with pytest.raises(InvalidParameterError, match="noise="):
        ta.audit_training(jax.random.key(0), problem, "dpsgd:noise=0,rate=0.1,steps=8,delta=1e-5")
    with pytest.raises(InvalidParameterError, match="claim=None"):
        ta.default_claim(dataclasses.replace(problem, noise_multiplier=None))
    raw = optax.GradientTransformation(  # a raw key is re-seeded now (tests/test_noise_probes.py)
        lambda p: (jax.random.PRNGKey(0),), lambda g, s, p=None: (g, s)
    )
    with pytest.raises(InvalidParameterError, match="batch axis as a parameter axis"):
        ta.prepare(dataclasses.replace(problem, step=raw))


def test_the_command_lines_worst_case_is_the_papers_setup_and_refuses_what_does_not_apply():
    got = ta.build_problem(data="worst-case", sampler="shuffle", steps=10, noise=0.7, batch_size=3)
    want = ta.worst_case_problem(steps=10, noise=0.7, batch_size=3)
    assert (got.name, got.steps, got.examples, got.sampling_rate) == (
        want.name, want.steps, want.examples, want.sampling_rate,
    )  # fmt: skip
    poisson = ta.build_problem(data="worst-case", sampler="poisson", steps=10)
    assert poisson.sampling_rate == 0.1 and poisson.examples == 80  # expected batch 8 by default
    # the relation, the bug and the step apply (the normalisation leaks need aligned data)
    bugged = ta.build_problem(
        data="worst-case", sampler="poisson", steps=10, bug="mean-over-batch", relation="zero-out"
    )
    assert bugged.relation == "zero-out" and "mean-over-batch" in bugged.name
    assert "optax" in ta.build_problem(data="worst-case", step="optax", steps=10).name
    for option, match in (
        ({"threat": "white-box"}, "threat='white-box' is invalid with data='worst-case'"),
        ({"n": 30}, "examples=30 is invalid with data='worst-case'"),
        ({"sampler": "fixed", "batch_size": 4}, "sampler='fixed' is invalid"),
        ({"step": "optax", "bug": "no-clip"}, "bug='no-clip' is invalid: bugs are planted"),
        ({"rate": 0.5}, "rate=0.5 is invalid with sampler='shuffle'"),
    ):
        with pytest.raises(InvalidParameterError, match=match):
            ta.build_problem(**({"data": "worst-case", "sampler": "shuffle"} | option))
    with pytest.raises(InvalidParameterError, match="steps=1 is invalid with batch_size=1"):
        ta.worst_case_problem(steps=1, noise=1.0, batch_size=1)


# --- long statistical checks (pytest -m slow) -----------------------------------------------------

SLOW = dict(data="synthetic", n=63, sampler="poisson", rate=0.125, steps=16, noise=1.0)
BUGGED = {
    "noise-after-averaging": (dict(bug="noise-after-averaging"), None, 10_000),
    "no-clip": (dict(bug="no-clip"), ta.Canary(kind="gradient", norm=10.0), 10_000),
    # the canary along a bias coordinate (flat index 0), which this bug leaves without noise
    "noise-on-subset": (
        dict(bug="noise-on-subset"),
        ta.Canary(kind="gradient", coordinate=0),
        10_000,
    ),
    # two epochs of shuffled batches of 8 from 64, accounted as Poisson at q = 1/8: the accountant's
    # curve at eps = 0.25 is 0.448, the shuffled run's about 0.49 (docs/theory/training_audit.md)
    "shuffle-as-poisson": (
        dict(sampler="shuffle", batch_size=8, rate=None, noise=0.5),
        None,
        20_000,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("step, noise", [("dp-sgd", 1.0), ("dp-sgd", 0.5), ("optax", 1.0)])
def test_twenty_audits_of_correct_runs_are_never_flagged(step, noise):
    # 'optax' is optax.contrib.dpsgd itself, Poisson-sampled, audited at its accountant's claim
    problem = ta.build_problem(**(SLOW | {"noise": noise, "step": step}))
    config = ta.training_audit_config(ta_claim_eps(problem), samples=20_000)
    flagged = [
        ta.audit_training(jax.random.key(s), problem, config=config).violation for s in range(20)
    ]
    print(f"correct runs, {step}, noise {noise}: {sum(flagged)} of 20 audits flagged")
    assert sum(flagged) == 0, flagged


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGGED))
def test_each_planted_bug_is_certified_in_19_of_20_audits(bug):
    kw, canary, runs = BUGGED[bug]
    problem = ta.build_problem(**(SLOW | kw))
    if canary is not None:
        problem = dataclasses.replace(problem, canary=canary)
    config = ta.training_audit_config(ta_claim_eps(problem), samples=runs)
    hits = [
        ta.audit_training(jax.random.key(s), problem, config=config).violation for s in range(20)
    ]
    print(f"{bug}: certified in {sum(hits)} of 20 audits")
    assert sum(hits) >= 19, hits


# --- the shuffle finding: the papers' worst case as training data ----------------------------------


@pytest.mark.parametrize("present", [1.0, 0.0])
@pytest.mark.parametrize("epochs", [1, 3])
def test_the_worst_case_data_release_the_papers_coordinates(present, epochs):
    # Almost no noise (S = 1e-4): every step's canary coordinate is -b (b clipped gradients of -C),
    # except the canary's one step of each epoch, which is -b + 2 with the canary in and -b + 1 with
    # it zeroed (zero-out, the papers' pair): the MoG(2) / MoG(1) of the lower bound, shifted by -b,
    # once per epoch. A clip that
    # did not bind (the data's gradient below C) or a learning rate that moved w x off 0 would show
    # as other values.
    problem = ta.worst_case_problem(
        steps=6, noise=1e-4, batch_size=4, epochs=epochs, relation="zero-out"
    )
    run = jax.jit(ta.make_run(problem, ta.prepare(problem)))
    z = np.asarray(run(jax.random.key(3), jnp.float32(present)).z).reshape(epochs, 6)
    for epoch in z:
        np.testing.assert_allclose(np.sort(epoch + 4.0), [0, 0, 0, 0, 0, 1 + present], atol=1e-3)


@pytest.mark.slow
@pytest.mark.ci
def test_shuffled_worst_case_refutes_its_poisson_claim_at_delta_1e5_and_poisson_does_not():
    # One epoch of 100 shuffled batches, S = 0.8, accounted as Poisson at q = 1/100: eps = 1.511 at
    # delta = 1e-5, while the run leaks at least 5.6 (shuffle_lower_epsilon). At level 0.999 the
    # audit certified 1.69, 1.92 and 2.01 with 2 x 10^4 runs per side (three keys) and 2.6 at level
    # 0.95 with 10^5 (benchmarks/measured/shuffle-finding/); 5 x 10^4 runs here. The control, Poisson
    # batches on the same data, is the claim's own mechanism: refuted with probability below 0.001.
    from cbdp_jax._src.privacy.accounting import dpsgd_epsilon

    claim_eps = dpsgd_epsilon(0.8, 0.01, 100, 1e-5)
    config = ta.training_audit_config(claim_eps, samples=50_000, confidence=0.999)
    shuffled = ta.worst_case_problem(steps=100, noise=0.8, relation="zero-out")
    res = ta.audit_training(jax.random.key(0), shuffled, config=config)
    assert res.violation and res.empirical.epsilon > claim_eps, res.verdict
    # Sound: never above the run's true eps, itself at most that of one Gaussian step of sensitivity
    # 1 (knowing which step holds the canary only helps; joint convexity).
    assert res.empirical.epsilon <= dpsgd_epsilon(0.8, 1.0, 1, 1e-5)
    control = ta.worst_case_problem(
        steps=100, noise=0.8, sampler="poisson", batch_size=4, relation="zero-out"
    )
    res = ta.audit_training(jax.random.key(1), control, config=config)
    assert not res.violation and res.empirical.epsilon < claim_eps, res.verdict


@pytest.mark.slow
def test_worst_case_shuffle_is_certified_in_19_of_20_audits_and_its_poisson_control_in_none():
    # The planted bug "shuffle accounted as Poisson" where the papers show the gap: 20 audits with
    # independent keys, 2 x 10^4 runs per side each, at the run's own dpsgd: claim (T = 100, S = 0.8).
    # zero-out, the papers' pair (docs/theory/training_audit.md, section 9)
    shuffled = ta.worst_case_problem(steps=100, noise=0.8, relation="zero-out")
    control = ta.worst_case_problem(
        steps=100, noise=0.8, sampler="poisson", batch_size=4, relation="zero-out"
    )
    config = ta.training_audit_config(ta_claim_eps(shuffled), samples=20_000)
    hits = [
        ta.audit_training(jax.random.key(s), shuffled, config=config).violation for s in range(20)
    ]
    false = [
        ta.audit_training(jax.random.key(100 + s), control, config=config).violation
        for s in range(20)
    ]
    print(f"worst-case shuffle: {sum(hits)} of 20 certified; Poisson control: {sum(false)} of 20")
    assert sum(hits) >= 19 and sum(false) == 0, (hits, false)


# --- the command line -----------------------------------------------------------------------------


def _cli(*args):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "cbdp_jax.cli", "audit-training", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a subprocess that imports JAX and compiles: 15-50 s on 2 shared cores
def test_cli_audit_training_runs_and_reports_json(tmp_path):
    import json

    proc = _cli(
        "--data", "synthetic", "--examples", "31", "--rate", "0.125", "--steps", "8",
        "--runs", "2000", "--bug", "noise-after-averaging", "--format", "json",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a certified violation
    record = json.loads(proc.stdout)
    assert record["violation"] and record["training"]["bug"] == "noise-after-averaging"
    assert record["claimed"]["source"]["rate"] == 0.125 and record["samples_per_side"] == 2000
    written = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert written["training"] == record["training"] and written["violation"]
    assert (tmp_path / "out" / "report.png").is_file()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--data", "synthetic", "--rate", "1.5"], "rate=1.5 is invalid"),
        (
            ["--data", "synthetic", "--step", "optax", "--bug", "no-clip"],
            "bug='no-clip' is invalid",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, needle):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
