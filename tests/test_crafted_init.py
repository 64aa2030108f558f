"""Worst-case initial parameters (cbdp_jax._src.training_auditor.crafted_init): the construction's conditions, the final
loss's exact Gaussian law, and the adversary-class curve on the same runs (cbdp_jax._src.training_auditor.class_curve)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax import training_audit as ta
from cbdp_jax._src.privacy.accounting import dpsgd_epsilon, dpsgd_noise
from cbdp_jax._src.training_auditor import class_curve as cc
from cbdp_jax._src.training_auditor import crafted_init as ci

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

# 300 digits, full batch, T = 16, S = 4: the accountant's GDP mu is sqrt(T) / S = 1
SETTING = dict(model="logreg", n=300, noise=4.0, rate=1.0, steps=16, fit_steps=1000, chunk=512)
RUNS = 1500


@pytest.fixture(scope="module")
def worst():
    return ci.crafted_problem(init="worst-case", **SETTING)


def test_worst_case_start_saturates_the_data_and_clips_the_canary(worst):
    problem, report = worst
    assert report.train_accuracy == 1.0 and report.saturated == 1.0  # every data gradient is 0
    assert report.data_margin >= ci.DATA_MARGIN and report.canary_margin >= ci.CANARY_MARGIN
    assert report.noise_share <= ci.LINEARITY and report.canary_gradient > 1.0  # clipping binds
    x, y = problem.data
    assert report.dead_features and np.all(np.asarray(x)[:, list(report.dead_features)] == 0)
    assert problem.canary.y != int(np.argmax(np.asarray(problem.model(problem.canary.x[None]))))
    # negative control: the default initialisation saturates nothing
    _, average = ci.crafted_problem(init="average-case", **SETTING)
    assert average.saturated < 0.05 and average.scale == 1.0


def test_rescaling_multiplies_the_logits_and_keeps_the_predictions():
    x, y = ta.load_data("digits", n=64)
    for kind in ("mlp", "cnn"):
        model = ta.make_model(kind, 64, 10, seed=1)
        before = np.asarray(model(x), np.float64)
        after = np.asarray(ci.rescale(model, 2.0)(x), np.float64)
        depth = len(ci._layers(model))
        np.testing.assert_allclose(after, before * 2.0**depth, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.ci  # 20-42 s: end to end (docs/guide/testing.md)
def test_worst_case_black_box_loss_is_the_accountants_gaussian(worst):
    # On D' the canary's final loss is c - k S sqrt(T) Z and on D c - k (T + S sqrt(T) Z): the
    # standardised shift is sqrt(T) / S = 1 and the spreads are equal. With 1500 runs a side the
    # shift's standard error is sqrt(2 / 1500) = 0.037 and the spread ratio's about 0.037: 4 of
    # each (0.15) is the test's tolerance.
    problem, _ = worst
    prep = ta.prepare(problem)
    d, _ = cc.curve_runs(jax.random.key(1), problem, RUNS, canary=True, prep=prep)
    d2, _ = cc.curve_runs(jax.random.key(2), problem, RUNS, canary=False, prep=prep)
    a, b = d["loss"], d2["loss"]
    assert abs((a.mean() - b.mean()) / b.std() - 1.0) < 0.15
    assert abs(a.std() / b.std() - 1.0) < 0.15
    # exactly Gaussian: the loss is an affine function of the white-box projection (the final
    # parameters' move along the canary's gradient), itself the sum of Gaussian noise projections;
    # to float32 rounding of logits in the hundreds (measured 1 - 1.1e-6)
    for seen in (d, d2):
        assert np.corrcoef(seen["loss"], seen["white-box"])[0, 1] > 1.0 - 1e-4
    # negative control: the library's default canary at the default initialisation is neither
    default = ta.build_problem(
        data="digits", n=300, rate=1.0, steps=16, noise=4.0, threat="black-box", chunk=512
    )
    e, _ = cc.curve_runs(jax.random.key(3), default, RUNS, canary=False)
    assert np.corrcoef(e["loss"], e["white-box"])[0, 1] < 0.999


def test_dpsgd_noise_inverts_the_accountant():
    for eps, rate, steps in ((10.0, 1.0, 100), (1.0, 0.5, 4)):
        s = dpsgd_noise(eps, 1e-5, rate, steps)
        assert eps - 1e-3 < dpsgd_epsilon(s, rate, steps, 1e-5) <= eps
    assert abs(dpsgd_noise(10.0, 1e-5, 1.0, 100) - 5.0) < 0.01  # mu = sqrt(100) / 5 = 2 at eps 10
    with pytest.raises(InvalidParameterError, match="epsilon"):
        dpsgd_noise(-1.0, 1e-5, 1.0, 10)


@pytest.mark.slow
@pytest.mark.ci
def test_class_curve_certifies_every_class_on_the_same_runs(worst):
    problem, _ = worst
    curve = cc.class_curve(jax.random.key(4), problem, runs=RUNS, max_params=64)
    assert [p.adversary for p in curve.points] == list(cc.ADVERSARIES)
    assert all(p.epsilon <= curve.claimed_epsilon for p in curve.points)  # never above the claim
    one_d = {p.adversary: p for p in curve.points if p.features == 1}
    # the loss, the white-box projection and the full-batch likelihood ratio order the runs alike
    # (affine in one another here), so their certified bounds agree to the critics' ties
    mus = [p.mu for p in one_d.values()]
    assert max(mus) - min(mus) < 0.05 and min(mus) > 0.5  # mu 1: at 1500 runs about 0.75
    params = [p for p in curve.points if p.adversary in ("linear", "mlp")]
    assert all("64 of 650 parameters" in p.label and p.features == 64 for p in params)
    assert math.isfinite(curve.run_seconds)
