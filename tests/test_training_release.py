"""What a training run releases beyond its score, and the critic family certified on it.

A user's DP step that reuses its noise key passes an audit by the accountant's own score (it looks
more private than a correct step) but not an audit of everything the gradient threat releases
(docs/theory/training_audit.md, section 10). The steps here are written as a user would, as optax
transformations with a key in their state.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax import training_audit as ta
from cbdp_jax._src.statistics import binomial
from cbdp_jax._src.statistics.bounds import family_confidence
from cbdp_jax._src.training_auditor.release import moved_magnitudes, release_layout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
from user_noise_bugs import problem, user_step  # noqa: E402  (a user's step, as a user writes it)

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

RUNS = 1500  # runs per side of the audits here: one compiled program per problem


def problem_of(bug: str = "none", *, noise: float = 1.0, steps: int = 16):
    """The issue's setting: logistic regression, 63 synthetic examples, Poisson q = 1/8, T = 16."""
    step = user_step(bug, noise=noise)
    return problem(step, noise=noise, steps=steps, chunk=4096, name=f"user step [{bug}]")


@pytest.fixture(scope="module")
def key_reuse():
    return problem_of("key-reuse")


# --- the release --------------------------------------------------------------------------------


def test_the_gradient_release_records_the_canary_dead_twins_and_moved_coordinates():
    problem = problem_of()
    prep = ta.prepare(problem)
    layout = release_layout(problem, prep)
    moved = moved_magnitudes(prep)
    assert layout.kind == "updates" and layout.steps == 16
    assert layout.coordinates[0] == prep.coordinate and layout.roles[0] == "canary"
    twins = [layout.coordinates[i] for i in layout.columns("twin")]
    busy = [layout.coordinates[i] for i in layout.columns("moved")]
    # the synthetic data's feature 0 is 0 in every example: its two class weights are dead
    assert twins and all(moved[c] == 0.0 for c in twins) and prep.coordinate not in twins
    assert len(busy) == 3 and all(moved[c] > 0 for c in busy)
    assert len(set(layout.coordinates)) == layout.width


def test_without_noise_the_twin_is_exactly_zero_and_the_canary_column_is_its_score():
    problem = problem_of(noise=0.0)
    mech = ta.training_mechanism(problem)
    layout = mech.release
    n = 200
    out = ta.training_runs(
        jax.random.key(3), problem, n, canary=1.0, prep=mech.prep, release=layout
    )
    d = mech.sample(jax.random.key(3), [1.0], n)  # the same runs, in the same compiled program
    assert d.shape == (n, 1 + layout.steps * layout.width)
    series = d[:, 1:].reshape(n, layout.steps, layout.width)
    # the gather and the engine's own projection on the canary's direction agree (float32 sums)
    np.testing.assert_allclose(series[:, :, 0], out.z, rtol=0, atol=1e-6)
    # no noise: the canary's coordinate moves by exactly one canary unit when in the batch, else 0
    assert set(np.round(np.unique(series[:, :, 0]), 5)) <= {0.0, 1.0}
    assert np.all(series[:, :, list(layout.columns("twin"))] == 0.0)
    assert np.any(series[:, :, list(layout.columns("moved"))] != 0.0)
    d2 = mech.sample(jax.random.key(4), [0.0], n)  # D': the canary's coordinate never moves
    assert np.all(d2[:, 1:].reshape(n, layout.steps, layout.width)[:, :, 0] == 0.0)


def test_one_weight_and_white_box_and_black_box_releases():
    worst = ta.worst_case_problem(steps=4, noise=1.0)
    layout = release_layout(worst, ta.prepare(worst))
    assert layout.kind == "updates" and layout.coordinates == (0,) and layout.roles == ("canary",)
    names = [g.name for g in ta.training_mechanism(worst).feature_groups]
    assert "twins" not in names and names[0] == "score" and "learned" in names
    white = ta.build_problem(data="synthetic", n=31, steps=4, rate=0.125, threat="white-box")
    layout = release_layout(white, ta.prepare(white))
    assert layout.kind == "final" and layout.steps == 1 and 1 <= len(layout.columns("canary")) <= 4
    black = ta.build_problem(data="synthetic", n=31, steps=4, rate=0.125, threat="black-box")
    assert ta.training_mechanism(black).feature_groups == ()


def test_an_unknown_feature_group_is_one_error_naming_the_parameter(key_reuse):
    config = ta.training_audit_config(4.0, samples=200, feature_groups=("score", "nope"))
    with pytest.raises(InvalidParameterError, match="feature_groups"):
        ta.audit_training(jax.random.key(0), key_reuse, config=config)


# --- the critic family --------------------------------------------------------------------------


def _ceiling(p_in: float, n_test: int, family: int, delta: float = 1e-5) -> float:
    """The eps a set with Q(S) = 0 and P(S) = p_in certifies on average (exact binomial bounds)."""
    share = (1.0 - family_confidence(0.95, family)) / 2.0
    q_up = float(binomial.clopper_pearson_upper(0, n_test, 1.0 - share))
    p_lo = float(binomial.clopper_pearson_lower(round(p_in * n_test), n_test, 1.0 - share))
    return math.log((p_lo - delta) / q_up)


def test_a_key_reusing_step_is_certified_near_its_ceiling_and_the_score_alone_misses_it(key_reuse):
    key = jax.random.key(7)
    result = ta.audit_training(key, key_reuse, config=ta.training_audit_config(4.015, samples=RUNS))
    assert result.violation
    # a statistic constant under D' (no step-to-step change of the canary's coordinate) that
    # moves whenever the canary is in some but not all 16 batches: P = 1 - (7/8)^16 - (1/8)^16
    p_in = 1.0 - (7 / 8) ** 16 - (1 / 8) ** 16
    n_test = RUNS - int(RUNS * 0.3)
    top = _ceiling(p_in, n_test, result.family_size)
    # the held-out count of D's runs in S is Binomial(n_test, p_in): 4 standard errors below p_in
    low = _ceiling(p_in - 4 * math.sqrt(p_in * (1 - p_in) / n_test), n_test, result.family_size)
    assert low - 0.05 < result.empirical.epsilon <= top + 0.05
    assert result.empirical.epsilon > 4.015  # the claim itself is refuted at its own delta
    # negative control: the family of before (the accountant's score alone) sees nothing
    only = ta.training_audit_config(4.015, samples=RUNS, feature_groups=("score",))
    before = ta.audit_training(key, key_reuse, config=only)
    assert not before.violation and before.empirical.epsilon < 1.0
    assert {r.critic.split(":")[0] for r in before.rows} <= {"halfspace", "histogram(64 bins)",
                                                              "tail-halfspace"}  # fmt: skip


@pytest.mark.parametrize(
    "seed", [0, *(pytest.param(s, marks=[pytest.mark.slow, pytest.mark.ci]) for s in (1, 2))]
)  # one audit of 1,500 runs a side by default; the other two in CI (`-m "slow and ci"`)
def test_a_correct_user_step_is_never_flagged_at_a_raised_level(seed):
    # each audit is wrong with probability <= 0.001 (family-wise), so three pass but for 0.3%
    config = ta.training_audit_config(4.015, samples=RUNS, confidence=0.999)
    result = ta.audit_training(jax.random.key(100 + seed), _CORRECT, config=config)
    assert not result.violation
    assert result.empirical.epsilon < 4.015
    assert any(r.critic.startswith("learned:") for r in result.rows)


_CORRECT = problem_of("none")


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["scalar", "even-steps"])
def test_shared_and_missing_noise_are_certified_above_the_claim(bug):
    config = ta.training_audit_config(4.015, samples=RUNS)
    result = ta.audit_training(jax.random.key(11), problem_of(bug), config=config)
    assert result.violation and result.empirical.epsilon > 4.015


def test_the_score_group_alone_gives_the_rows_of_before():
    # the first group is the audit of before: same critics, same order; only the family grows
    problem = dataclasses.replace(problem_of(), steps=4)
    config = ta.training_audit_config(4.0, samples=400)
    full = ta.audit_training(jax.random.key(5), problem, config=config)
    only = ta.audit_training(
        jax.random.key(5), problem, config=dataclasses.replace(config, feature_groups=("score",))
    )
    assert only.family_size == 22 and full.family_size > only.family_size
    assert [r.critic for r in full.rows[:22]] == [r.critic for r in only.rows]
    assert [r.estimate for r in full.rows[:22]] == [r.estimate for r in only.rows]


def test_the_score_alone_records_no_release_and_a_release_too_large_names_the_way_out(monkeypatch):
    problem = dataclasses.replace(problem_of(), steps=4)
    only = ta.training_audit_config(4.0, samples=400, feature_groups=("score",))
    result = ta.audit_training(jax.random.key(5), problem, config=only)
    groups = {"sum", "steps", "twins", "exact", "learned", "coordinates"}
    assert result.family_size == 22 and not {r.critic.split(":")[0] for r in result.rows} & groups
    mech = ta.training_mechanism(problem, release=False)
    assert mech.release is None and mech.output_dim([1.0]) == 1
    full = ta.training_mechanism(problem)
    assert full.output_dim([1.0]) == 1 + full.release.steps * full.release.width > 1
    # the memory check counts the release: with 4 GiB free, 10^7 runs of 1 + 4 k values (5.1 GiB
    # by infra/sizes.py's training_audit_bytes) are refused and the refusal names the score alone,
    # which the same memory holds (one value a run, 2.7 GiB)
    from cbdp_jax._src.infra import sizes

    monkeypatch.setattr(sizes, "available_bytes", lambda **_: 4 * 2**30)
    big = ta.training_audit_config(4.0, samples=10_000_000)
    with pytest.raises(InvalidParameterError, match="--critics score"):
        ta.audit_training(jax.random.key(5), problem, config=big)
    sizes.check_memory_for_audit(10_000_000, 100, 1, "runs")  # the score alone: allowed
