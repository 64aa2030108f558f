"""One-run training audits (issue 50): canaries inserted by coins into ONE training of a problem.

Each test trains small models for a few steps (a few seconds each); the soundness study over
repeats and the many-run audit of a user's sampler are slow-marked. Statistical tolerances are
stated beside each assertion with their binomial standard error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.mechanism_auditor.one_run import one_run_audit
from cbdp_jax._src.privacy.accounting import dpsgd_epsilon


def _problem(*, steps=20, rate=0.05, noise=1.0, bug="none", hidden=16, n=400):
    p = ta.build_problem(model="mlp", data="digits", n=n, noise=noise, rate=rate, steps=steps,
                         bug=bug, learning_rate=0.5)  # fmt: skip
    return dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=hidden))


def _small(*, noise=1.0):
    # logistic regression on the synthetic blobs (18 parameters): dense canaries, a short compile
    return ta.build_problem(model="logreg", data="synthetic", noise=noise, rate=0.1, steps=10,
                            learning_rate=0.2)  # fmt: skip


@pytest.fixture(scope="module")
def problem():
    return _problem(n=200, hidden=16, steps=10)


def _poisson_mask(key, step, n):
    return jax.random.bernoulli(jax.random.fold_in(key, step), 0.25, (n,))


def _shuffled_batches(key, step, n, b=4):
    # a user's fixed-size pipeline: one permutation per epoch cut into batches of b
    per = n // b
    perm = jax.random.permutation(jax.random.fold_in(key, step // per), n)
    return jax.lax.dynamic_slice(perm, ((step % per) * b,), (b,))


def test_a_users_sampler_gives_its_batches_with_absent_slots_dropped():
    mask = ta.BatchSampler(kind="custom", function=_poisson_mask, rate=0.25)
    got = mask.masks(jax.random.key(0), 12, 200, size=8)
    assert not got[:, 8:].any()  # absent slots are in no batch
    # 200 x 8 Bernoulli(0.25) draws: SE = sqrt(0.25 * 0.75 / 1600) = 0.011; 4 SE
    assert abs(float(got[:, :8].mean()) - 0.25) < 0.044
    fixed = ta.BatchSampler(kind="custom", function=_shuffled_batches, batch_size=4)
    assert fixed.capacity(12) == 4 and fixed.sampling_rate(12) == pytest.approx(4 / 12)
    epoch = fixed.masks(jax.random.key(1), 12, 3)
    assert epoch.sum(axis=0).tolist() == [1] * 12  # each example once an epoch
    assert fixed.accounted_as == "poisson"


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(kind="custom", function=None, rate=0.1), "function is invalid"),
        (dict(kind="custom", function=_poisson_mask), "rate=None is invalid"),
        (dict(kind="poisson", rate=0.1, function=_poisson_mask), "kind='custom'"),
    ],
)
def test_a_bad_user_sampler_is_one_clear_error(kw, words):
    with pytest.raises(InvalidParameterError, match=words):
        ta.BatchSampler(**kw)
    bad = ta.BatchSampler(kind="custom", function=lambda k, t, n: jnp.ones(n), rate=0.1)
    with pytest.raises(InvalidParameterError, match="function is invalid"):
        bad.capacity(5)


def test_same_key_same_result_and_the_coins_independent_of_the_training():
    problem = _small()
    a = ta.one_run_training(jax.random.key(7), problem, canaries=300, compare=False)
    b = ta.one_run_training(jax.random.key(7), problem, canaries=300, compare=False)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.coins, b.coins)
    assert a.bounds == b.bounds
    # The coins depend on the key alone: another training (more noise) draws the same coins ...
    other = ta.one_run_training(jax.random.key(7), _small(noise=3.0), canaries=300, compare=False)
    np.testing.assert_array_equal(other.coins, a.coins)
    assert not np.array_equal(other.scores, a.scores)
    # ... and another key another set (300 fair coins: agreeing on all has probability 2^-300).
    c = ta.one_run_training(jax.random.key(8), problem, canaries=300, compare=False)
    assert not np.array_equal(c.coins, a.coins)
    # Fair coins: included ~ Binomial(300, 1/2), SE = 8.7; 4 SE.
    assert abs(a.included - 150) < 35 and abs(c.included - 150) < 35


def test_included_canaries_are_in_the_batches_at_rate_q_and_excluded_ones_never():
    # Poisson at q = 0.05 over 20 steps: each (included canary, step) is an independent Bernoulli(q).
    # 200 examples with 11 blank pixels x 64 hidden units = 704 coordinates no example moves.
    wide = _problem(n=200, hidden=64)
    res = ta.one_run_training(jax.random.key(1), wide, canaries=700, compare=False)
    pairs = res.included * res.steps  # ~ 7000
    se = math.sqrt(0.05 * 0.95 / pairs)  # ~ 0.0026
    assert abs(res.hit_rate - 0.05) < 4 * se, (res.hit_rate, se)
    # the excluded canaries' scores are the noise alone: never a canary's own step (checked through
    # the coordinate canaries' exact law: mean 0, spread S sqrt(T) in canary units)
    assert res.directions == "coordinate"
    out = res.scores[~res.coins]
    sd = math.sqrt(res.steps)  # S = 1
    assert abs(out.mean()) < 4 * sd / math.sqrt(out.size)
    assert abs(res.noise_ratio - 1.0) < 4 / math.sqrt(2 * out.size)  # SE of a sample sd ratio
    inn = res.scores[res.coins]
    # included: plus Binomial(T, q) steps, mean qT = 1 in canary units
    assert abs(inn.mean() - out.mean() - 1.0) < 4 * sd * math.sqrt(2 / out.size)


def test_coordinate_canaries_cost_the_model_nothing_and_the_result_says_what_it_is(problem):
    res = ta.one_run_training(jax.random.key(2), problem, canaries=150)
    # coordinates no example moves are first-layer weights of blank pixels (11 x 16 = 176 here): the
    # model's outputs do not depend on them, so the price of the audit is zero (to float rounding)
    assert res.directions == "coordinate"
    assert res.accuracy_with == res.accuracy_without
    assert res.loss_with == pytest.approx(res.loss_without, rel=1e-5)
    d = res.to_dict()
    assert set(d["bounds"]) == {"steinke", "fdp", "gdp", "gaussian-scores"}
    assert d["bounds"]["steinke"]["kind"] == "finite-sample"
    assert d["bounds"]["gaussian-scores"]["kind"] == "asymptotic"
    assert "scores" not in d and len(res.to_dict(arrays=True)["scores"]) == 150
    assert res.claim_epsilon == pytest.approx(dpsgd_epsilon(1.0, 0.05, 10, 1e-5))
    assert not res.violation
    if res.claim_epsilon >= res.reach:
        assert "cannot certify more than" in res.verdict


def test_dense_directions_pay_an_interference(problem):
    res = ta.one_run_training(jax.random.key(3), problem, canaries=300, directions="dense")
    assert res.directions == "dense"
    # the data's gradients and the other canaries move every dense direction: the excluded scores
    # spread more than the noise alone (ratio > 1), and the price is visible in the model
    assert res.noise_ratio > 1.0
    assert not res.violation


@pytest.mark.slow
def test_a_step_without_clipping_is_certified_in_one_run():
    # no-clip: canaries of norm 100 C (the auditor's choice; a clipping step cuts them to C) move
    # 100x what the accountant allows. 200 examples, 64 hidden units: 704 coordinates no example
    # moves, one per canary (m = 700). benchmarks/one_run_training.py bugs: fdp 4.50 > 2.0 at m = 1000.
    def make(bug):
        p = ta.build_problem(model="mlp", data="digits", n=200, noise=1.5, rate=0.05, steps=100,
                             bug=bug, canary_norm=100.0)  # fmt: skip
        return dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=64))

    res = ta.one_run_training(jax.random.key(4), make("no-clip"), canaries=700, compare=False)
    assert res.directions == "coordinate"
    assert res.violation, res.verdict
    name, eps = res.best()
    assert eps > res.claim_epsilon and name in ("steinke", "fdp", "gdp")
    # the control: the same run with clipping is not refuted
    ok = ta.one_run_training(jax.random.key(4), make("none"), canaries=700, compare=False)
    assert not ok.violation, ok.verdict


def test_post_hoc_coins_are_caught_as_unsound():
    # Negative control for the soundness count: a method that picks "which canaries were in" after
    # seeing the scores (the top half) reports the all-correct bound in every run, far above a claim
    # of 1, where the real coins give nothing. The count of runs above the claim tells them apart.
    rng = np.random.default_rng(0)
    above_real = above_post_hoc = 0
    for _ in range(10):
        coins = rng.random(1000) < 0.5
        scores = rng.normal(size=1000) + 0.1 * coins  # a run far below eps = 1
        post_hoc = scores > np.median(scores)
        above_real += one_run_audit(scores, coins, method="fdp").epsilon > 1.0
        above_post_hoc += one_run_audit(scores, post_hoc, method="fdp").epsilon > 1.0
    assert above_real == 0 and above_post_hoc == 10


@pytest.mark.slow
def test_one_run_bounds_are_sound_over_repeats_of_a_correct_training():
    # 12 independent one-run audits of a correct training (m = 500), vmapped; at level 0.999 each
    # finite-sample bound exceeds the accountant with probability <= 0.001 (<= 3.6% for any of
    # 36); the asymptotic bound is held to the same count.
    p = _problem(steps=60, rate=0.05, noise=1.0)
    results = ta.one_run_repeats(jax.random.key(11), p, 12, canaries=500, level=0.999)
    assert len({r.included for r in results}) > 1  # independent coins
    for method in ("steinke", "fdp", "gdp", "gaussian-scores"):
        above = [(r.bounds[method]["epsilon"] or 0.0) > r.claim_epsilon for r in results]
        assert sum(above) == 0, (method, above)


USER_FILE = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from cbdp_jax import training_audit as ta


    def hinge(model, x, y):  # a custom loss: multi-class squared hinge on integer labels
        out = model(x)
        margin = 1.0 - out * (2.0 * jax.nn.one_hot(y, out.shape[-1]) - 1.0)
        return (jnp.maximum(margin, 0.0) ** 2).sum(-1).mean()


    def my_batches(key, step, n):  # a custom sampler: Poisson, as a mask
        return jax.random.bernoulli(jax.random.fold_in(key, step), 0.1, (n,))


    def make_problem():
        x, y = ta.load_data("synthetic", n=128)
        n, m = 128, 1000
        step = lambda size: ta.dp_sgd(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.0,
                                      expected_batch_size=0.1 * size)
        return ta.TrainingProblem(
            model=nnx.Linear(8, 2, rngs=nnx.Rngs(0)), data=(x, y), step=step,
            sampler=ta.BatchSampler(kind="custom", function=my_batches, rate=0.1), steps=5,
            noise_multiplier=1.0, l2_norm_clip=1.0, loss_fn=hinge, name="my hinge",
        )
    """
)


def test_cli_one_run_on_a_users_problem_file(tmp_path):
    path = tmp_path / "my_training.py"
    path.write_text(USER_FILE)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    args = ["audit-training", "--problem", f"{path}:make_problem", "--one-run", "--canaries",
            "1000", "--format", "json"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", *args], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["canaries"] == 1000 and rec["training"]["problem"].endswith(":make_problem")
    assert rec["directions"] == "dense"  # 18 parameters: no 1000 dead coordinates
    assert rec["step_size"] == 128 + 500  # the factory gets n + m // 2, not the realised size
    assert {b["kind"] for b in rec["bounds"].values()} == {"finite-sample", "asymptotic"}
    assert rec["violation"] is False and math.isnan(float(rec["accuracy_with"]))
    # 5 steps x ~500 included canaries, Bernoulli(0.1): SE = sqrt(0.09 / 2500) = 0.006; 4 SE
    assert abs(rec["hit_rate"] - 0.1) < 0.024
    bad = subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", *args, "--runs", "1000"], capture_output=True,
        text=True, env=env, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and "runs=1000 is invalid with --one-run" in bad.stderr


@pytest.mark.slow
def test_a_users_fixed_size_sampler_accounted_as_poisson_is_certified_on_aligned_data():
    # The many-run audit of a sampler the library never sees: the user's pipeline shuffles each
    # epoch and cuts fixed batches of 4 (Chua et al. 2024's worst case), accounted as Poisson at
    # q = 1/100; on the aligned worst-case data (every clipped gradient -C) the run leaks far
    # above the claim (docs/theory/training_audit.md); 2 x 10^4 runs per side certify it, as for
    # the built-in shuffle (tests/test_training_audit.py).
    base = ta.worst_case_problem(steps=100, noise=0.8, relation="zero-out")
    sampler = ta.BatchSampler(kind="custom", function=_shuffled_batches, batch_size=4)
    user = dataclasses.replace(base, sampler=sampler)
    claim = ta.default_claim(user)
    assert "sampling=poisson" in claim and "rate=0.01," in claim
    eps = dpsgd_epsilon(0.8, 0.01, 100, 1e-5)
    config = ta.training_audit_config(eps, samples=20_000)
    res = ta.audit_training(jax.random.key(0), user, config=config)
    assert res.violation, res.verdict


SHARDED = textwrap.dedent(
    """
    import jax, numpy as np
    from cbdp_jax import training_audit as ta
    p = ta.build_problem(model="mlp", data="digits", n=300, noise=1.0, rate=0.05, steps=10)
    assert len(jax.devices()) == 2
    one = ta.one_run_training(jax.random.key(3), p, canaries=100, compare=False,
                              devices=jax.devices()[:1])
    two = ta.one_run_training(jax.random.key(3), p, canaries=100, compare=False)
    reps = ta.one_run_repeats(jax.random.key(3), p, 4, canaries=100)
    print(float(np.max(np.abs(one.scores - two.scores))), bool(np.array_equal(one.coins, two.coins)),
          len({r.included for r in reps}))
    """
)


@pytest.mark.slow
def test_one_run_splits_its_batch_over_two_devices_with_the_same_result():
    # two CPU devices in a fresh process: the batch split over both (data parallel) gives the
    # single device's scores (to float rounding) and the same coins; repeats shard their keys
    env = dict(os.environ, PYTHONPATH=os.getcwd(),
               XLA_FLAGS="--xla_force_host_platform_device_count=2")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                          env=env, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    diff, same, distinct = proc.stdout.split()
    assert float(diff) < 1e-3 and same == "True" and int(distinct) > 1


# --- the noise probes on a one-run audit -----------------------------------------------------------

SYN = dict(data="synthetic", n=31, rate=0.125, steps=6)


def test_a_defect_makes_a_one_run_verdict_say_so_unless_a_violation_is_certified():
    # with_defects on plain results (no training): a defect without a certified violation is never
    # a plain pass; beside a violation the verdict keeps the violation; no defect changes nothing.
    from cbdp_jax._src.mechanism_auditor.results import Defect
    from cbdp_jax._src.training_auditor.one_run.audit import OneRunTrainingResult, with_defects

    fields = dict(kind="gradient", canaries=10, included=5, directions="coordinate", bounds={},
                  claim_epsilon=2.0, delta=1e-5, level=0.95, asymptotic_violation=False,
                  reach=1.0, loss_with=0.0, loss_without=0.0, accuracy_with=1.0,
                  accuracy_without=1.0, hit_rate=0.1, noise_ratio=1.0, step_size=None,
                  examples=10, steps=3, sampling_rate=0.1)  # fmt: skip
    defect = Defect("noise-not-fresh", "the noise at step 1 is the noise at step 0")
    clean = OneRunTrainingResult(**fields, violation=False, verdict="no violation certified")
    named = with_defects(clean, (defect,))
    assert named.defects == (defect,) and "not a clean bill" in named.verdict
    assert "noise-not-fresh" in named.verdict and named.to_dict()["defects"][0]["kind"] == (
        "noise-not-fresh"
    )
    assert with_defects(clean, ()).verdict == clean.verdict  # negative control: no defect
    refuted = OneRunTrainingResult(**fields, violation=True, verdict="VIOLATION: fdp ...")
    assert with_defects(refuted, (defect,)).verdict == refuted.verdict


@pytest.mark.slow  # three one-run trainings with the probes: minutes on a loaded 2-core machine
def test_a_one_run_audit_of_a_step_with_reused_noise_names_the_defect_and_a_correct_step_none():
    # key-reuse: the step's state returns its key unchanged, the same noise at every step. The
    # probes (a sign test at family-wise level 1e-6, tests/test_noise_probes.py) name it before the
    # run; the negative control, the correct dp_sgd on the same data, names nothing (a false
    # defect has probability <= 1e-6).
    bad = ta.one_run_training(jax.random.key(0), ta.build_problem(**(SYN | {"bug": "key-reuse"})),
                              canaries=100, compare=False)  # fmt: skip
    assert [d.kind for d in bad.defects] == ["noise-not-fresh"]
    assert not bad.violation and "not a clean bill" in bad.verdict
    assert bad.to_dict()["defects"][0]["kind"] == "noise-not-fresh"
    ok = ta.one_run_training(jax.random.key(0), ta.build_problem(**SYN), canaries=100,
                             compare=False)  # fmt: skip
    assert ok.defects == () and "clean bill" not in ok.verdict
    unchecked = ta.one_run_training(jax.random.key(0), ta.build_problem(**(SYN | {"bug": "key-reuse"})),
                                    canaries=100, compare=False, noise_probes=False)  # fmt: skip
    assert unchecked.defects == ()  # probes off: nothing named (and nothing claimed checked)


@pytest.mark.slow  # one audit-training process: about half a minute cold
def test_the_cli_one_run_exits_3_on_a_defect_without_a_violation():
    args = ["audit-training", "--data", "synthetic", "--rate", "0.125", "--steps", "6",
            "--bug", "key-reuse", "--one-run", "--canaries", "100", "--format", "json"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "cbdp_jax.cli", *args], capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    rec = json.loads(proc.stdout)
    assert not rec["violation"] and [d["kind"] for d in rec["defects"]] == ["noise-not-fresh"]
    ok = subprocess.run([sys.executable, "-m", "cbdp_jax.cli", *args[:7], *args[9:]],
                        capture_output=True, text=True, timeout=900)  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]  # the correct step: no defect, exit 0
    assert json.loads(ok.stdout)["defects"] == []
