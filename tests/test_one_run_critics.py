"""The one-run audit's critics family (issue 50): the score and the step-difference critics.

Two trainings run by default (small digits MLPs, 30 steps, noise probes off: compile-bound, 13 s
and 7 s at load 3.6, 60 s and 30 s at load 11): reused noise and the correct step. The test of
other families trains twice more and is slow-marked. The rest checks the scan's step statistics,
the family's level split and its negative controls without training; the null simulations state
their binomial tolerances beside each assertion.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.mechanism_auditor.one_run import one_run_audit
from cbdp_jax._src.training_auditor.one_run.critics import family_bounds, resolve_critics
from cbdp_jax._src.training_auditor.one_run.engine import _accumulate


def _problem(bug="none", *, noise=2.0, steps=30, rate=0.2):
    # 200 digits, 16 hidden units: 176 first-layer coordinates no example moves (blank pixels),
    # so m = 150 gradient canaries are coordinate canaries; canaries of norm 100 C (clipped to C)
    p = ta.build_problem(model="mlp", data="digits", n=200, noise=noise, rate=rate, steps=steps,
                         bug=bug, learning_rate=0.5, canary_norm=100.0)  # fmt: skip
    return dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=16))


def _audit(bug, **kw):
    return ta.one_run_training(jax.random.key(7), _problem(bug), canaries=150, compare=False,
                               noise_probes=False, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def reused():
    return _audit("key-reuse")


@pytest.fixture(scope="module")
def correct():
    return _audit("none")


def test_reused_noise_is_certified_by_the_step_critic_where_the_score_sees_nothing(reused):
    # key-reuse adds the same noise at every step: it cancels in z_t - z_{t-1}, so an excluded
    # canary's max |dz| is exactly 0 and an included one's is 1 (it entered or left a batch;
    # P(never in 30 batches at q = 0.2) = 0.8^30 = 0.1%). Every guess is right: the bound is the
    # reach of m = 150 at level 0.975. The sum score is T S noise: nothing above the claim.
    assert reused.critics == ("score", "steps-max")
    assert reused.violation, reused.verdict
    assert reused.certified_by() == "steps-max" and "steps-max critic" in reused.verdict
    assert reused.bounds["fdp"]["critic"] == "steps-max"
    assert reused.bounds["fdp"]["epsilon"] > reused.claim_epsilon
    assert reused.bounds["fdp"]["epsilon"] == pytest.approx(reused.reach, rel=0.02)
    assert max(e or 0.0 for e in reused.critic_bounds["score"].values()) < reused.claim_epsilon
    assert reused.bounds["fdp"]["family"] == 2 and reused.bounds["fdp"]["level"] == 0.975
    assert reused.to_dict()["critics"] == ["score", "steps-max"]
    assert reused.to_dict()["critic_bounds"]["steps-max"]["fdp"] > reused.claim_epsilon


def test_a_correct_step_is_not_certified_by_any_critic(correct):
    # negative control of the test above: fresh noise at every step, the same problem and key
    assert not correct.violation, correct.verdict
    for critic, bounds in correct.critic_bounds.items():
        for method in ("steinke", "fdp", "gdp"):
            assert (bounds[method] or 0.0) < correct.claim_epsilon, (critic, method)


def test_each_critic_is_audited_at_its_share_of_beta(correct):
    # independent value: one_run_audit on the score critic's own scores at level 1 - 0.05 / 2
    direct = one_run_audit(correct.scores, correct.coins, method="fdp", level=0.975).epsilon
    assert correct.critic_bounds["score"]["fdp"] == pytest.approx(direct)
    best = max(correct.critic_bounds[c]["fdp"] for c in correct.critics)
    assert correct.bounds["fdp"]["epsilon"] == best


@pytest.mark.slow
def test_a_family_of_one_is_the_plain_audit_and_the_sum_critic_family(correct):
    alone = _audit("none", critics=("score",))
    direct = one_run_audit(alone.scores, alone.coins, method="fdp", level=0.95).epsilon
    assert alone.critics == ("score",) and alone.bounds["fdp"]["epsilon"] == pytest.approx(direct)
    np.testing.assert_array_equal(alone.scores, correct.scores)  # same key, same run
    three = _audit("key-reuse", critics=("score", "steps-max", "steps-sq"))
    assert three.bounds["fdp"]["family"] == 3 and three.bounds["fdp"]["level"] == pytest.approx(
        1 - 0.05 / 3
    )
    assert three.critic_bounds["steps-sq"]["fdp"] > three.claim_epsilon  # dz^2 separates too


def test_the_step_statistics_kept_in_the_scan_equal_those_of_the_whole_series():
    # independent value: numpy on the whole [T, m] series against the scan's running statistics
    rng = np.random.default_rng(1)
    t_steps, m, s2, q = 12, 5, 1.7**2, 0.1
    z = rng.normal(size=(t_steps, m)).astype(np.float32)
    z[:, 0] = 0.3  # a constant series (reused noise, never in a batch): every difference 0
    series = tuple(np.zeros(m, np.float32) for _ in range(4))
    for t in range(t_steps):
        series = _accumulate(series, z[t], t, s2, q)
    dz = np.diff(z, axis=0)
    llr = np.log(1 - q + q * np.exp((2 * z - 1) / (2 * s2))).sum(0)
    np.testing.assert_allclose(series[1], llr, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(series[2], np.abs(dz).max(0), rtol=1e-6)
    np.testing.assert_allclose(series[3], (dz**2).sum(0), rtol=1e-5)
    assert series[2][0] == 0.0 and series[3][0] == 0.0  # exactly, not nearly


def test_each_method_takes_its_best_critic_at_level_one_minus_beta_over_k():
    # independent value: one_run_audit on each critic's scores at 1 - 0.05 / 2
    rng = np.random.default_rng(2)
    coins = rng.random(400) < 0.5
    weak, strong = rng.normal(size=400) + 0.2 * coins, rng.normal(size=400) + 3.0 * coins
    bounds, by = family_bounds(_Out(weak, strong), coins, ("score", "steps-max"), delta=1e-5,
                               level=0.95, use_llr=False)  # fmt: skip
    for critic, s in (("score", weak), ("steps-max", strong)):
        direct = one_run_audit(s, coins, method="steinke", level=0.975).epsilon
        assert by[critic]["steinke"] == pytest.approx(direct)
    assert bounds["steinke"]["critic"] == "steps-max" and bounds["steinke"]["score"] == "steps-max"
    assert bounds["steinke"]["epsilon"] == by["steps-max"]["steinke"] > by["score"]["steinke"]
    assert bounds["steinke"]["family"] == 2 and bounds["steinke"]["level"] == 0.975
    assert bounds["gaussian-scores"]["kind"] == "asymptotic"


def test_bad_critics_are_one_clear_error():
    with pytest.raises(InvalidParameterError, match="critics"):
        resolve_critics(("score", "bogus"), has_steps=True)
    with pytest.raises(InvalidParameterError, match="critics"):
        resolve_critics((), has_steps=True)
    with pytest.raises(InvalidParameterError, match="step critics"):
        resolve_critics(("score", "steps-max"), has_steps=False)
    assert resolve_critics("auto", has_steps=False) == ("score",)
    with pytest.raises(InvalidParameterError, match="critics"):
        small = ta.build_problem(model="logreg", data="synthetic", noise=1.0, rate=0.1, steps=2)
        ta.one_run_training(jax.random.key(0), small, canaries=10, critics=("max",))


class _Out:
    """A run's critic scores without a training (the fields family_bounds reads)."""

    def __init__(self, scores, step_max, step_sq=None):
        self.scores, self.llr, self.step_max = scores, scores, step_max
        self.step_sq = step_max if step_sq is None else step_sq


def test_a_critic_that_peeks_at_the_coins_is_caught():
    # Negative control: the audit is only as sound as its critics are blind to the coins. A
    # "critic" built from the coins certifies the reach on scores that carry nothing, far above
    # a claim of 1 in every trial; the same family with a blind critic certifies nothing.
    rng = np.random.default_rng(0)
    for _ in range(5):
        coins = rng.random(1000) < 0.5
        noise = rng.normal(size=1000)
        peek, _ = family_bounds(_Out(noise, coins + 0.01 * noise), coins, ("score", "steps-max"),
                                delta=1e-5, level=0.95, use_llr=False)  # fmt: skip
        blind, _ = family_bounds(_Out(noise, rng.normal(size=1000)), coins, ("score", "steps-max"),
                                 delta=1e-5, level=0.95, use_llr=False)  # fmt: skip
        assert peek["fdp"]["epsilon"] > 1.0 and peek["fdp"]["critic"] == "steps-max"
        assert blind["fdp"]["epsilon"] < 1.0


def test_the_maximum_over_critics_without_the_split_is_caught_as_unsound():
    # Negative control for the Bonferroni split: K = 10 critics that carry nothing (scores
    # independent of the coins: a 0-DP mechanism, any eps > 0 is a false refutation). At beta = 0.5
    # a valid family errs in <= 50% of 40 trials (<= 20 +- 3.2, so <= 29 at 3 sd); the maximum of
    # unsplit bounds erred in 39 of 40 (seed 0), beyond any valid procedure. The split (each at
    # beta / K, what family_bounds does) erred in 7.
    rng = np.random.default_rng(0)
    trials, k, m, beta = 40, 10, 200, 0.5
    unsplit = split = 0
    for _ in range(trials):
        coins = rng.random(m) < 0.5
        each = [rng.normal(size=m) for _ in range(k)]
        audit = lambda s, lv, c=coins: one_run_audit(s, c, method="fdp", level=lv).epsilon
        unsplit += max(audit(s, 1 - beta) for s in each) > 0
        split += max(audit(s, 1 - beta / k) for s in each) > 0
    assert split <= 29 < unsplit


def test_the_cli_says_which_critic_certified(capsys):
    from types import SimpleNamespace

    from cbdp_jax._src.training_auditor.one_run.audit import OneRunTrainingResult
    from cbdp_jax.cli.one_run_training import _emit

    bound = dict(epsilon=5.03, kind="finite-sample", score="steps-max", critic="steps-max")
    refused = dict(epsilon=None, refused="binary scores", kind="asymptotic", score=None,
                   critic=None)  # fmt: skip
    bounds = {"steinke": bound, "fdp": bound, "gdp": bound, "gaussian-scores": refused}
    res = OneRunTrainingResult(
        kind="gradient", canaries=1000, included=500, directions="coordinate", bounds=bounds,
        claim_epsilon=2.0, delta=1e-5, level=0.95, violation=True, asymptotic_violation=False,
        reach=5.3, verdict="VIOLATION: fdp, steps-max critic certifies eps >= 5.03", loss_with=0.1,
        loss_without=0.1, accuracy_with=0.9, accuracy_without=0.9, hit_rate=0.02, noise_ratio=1.0,
        step_size=2297, examples=1797, steps=300, sampling_rate=0.02,
        critics=("score", "steps-max"),
    )  # fmt: skip
    _emit(res, SimpleNamespace(name="digits"), {}, "text", None)
    text = capsys.readouterr().out
    assert "over the critics (score, steps-max), each at 0.975" in text
    assert "steps-max critic]" in text and "by the steps-max critic" in text
