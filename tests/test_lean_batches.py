"""Lean Poisson batches: fewer slots, the overflowing runs recomputed at the full capacity.

The repaired block must give the full-capacity engine's outputs for the same keys (the same law, no
drops beyond the full capacity's), also where overflow at the lean capacity is frequent; without
the repair the outputs differ (negative control).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra.sharded_runs import sharded_runs
from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.training_auditor import lean_batches, normal_draws
from cbdp_jax._src.training_auditor import runs as engine


@pytest.mark.parametrize("count", [1, 7, 8, 23, 24, 31, 47])
def test_fewer_words_are_a_prefix_of_the_full_capacitys_words(count):
    key = jax.random.key(11)
    full = np.asarray(normal_draws.uniform_words(key, 47))
    np.testing.assert_array_equal(normal_draws.uniform_words(key, count, 47), full[:count])


def test_fewer_slots_give_the_first_members_of_the_full_batch_and_flag_a_full_last_slot():
    sampler = ta.BatchSampler(kind="poisson", rate=0.125)
    n, cap, plan, steps = 64, sampler.capacity(64), jax.random.key(3), jax.numpy.arange(200)
    idx, valid, _ = jax.vmap(lambda t: sampler.batch(plan, t, n))(steps)
    small, small_valid, over = jax.vmap(lambda t: sampler.batch(plan, t, n, slots=9))(steps)
    for t in range(200):
        members = np.asarray(idx[t])[np.asarray(valid[t])]
        np.testing.assert_array_equal(np.asarray(small[t])[np.asarray(small_valid[t])], members[:9])
        assert int(over[t]) == int(members.size >= 9)  # the 9th slot used: maybe truncated
    assert cap > 9 and 0 < int(over.sum()) < 200  # Binomial(64, 1/8) >= 9: about 31% of steps


def test_slots_are_refused_outside_the_capacity_and_for_other_samplers():
    poisson = ta.BatchSampler(kind="poisson", rate=0.125)
    with pytest.raises(InvalidParameterError, match="slots=0 is invalid"):
        poisson.batch(jax.random.key(0), 0, 64, slots=0)
    with pytest.raises(InvalidParameterError, match="slots=3 is invalid"):
        ta.BatchSampler(kind="fixed", batch_size=8).batch(jax.random.key(0), 0, 64, slots=3)


def test_run_overflow_is_the_exact_binomial_tail_over_steps():
    # against a Monte Carlo of max_t Binomial(64, 1/8) over T = 16 steps: 200,000 runs, the
    # probability's standard error sqrt(p (1 - p) / 200000) <= 0.0012; 5 se (two-sided 6e-7)
    n, q, steps, c = 64, 0.125, 16, 14
    rng = np.random.default_rng(0)
    hit = (rng.binomial(n, q, size=(200_000, steps)) >= c).any(axis=1).mean()
    p = lean_batches.run_overflow(n, q, steps, c)
    assert abs(hit - p) < 5 * math.sqrt(p * (1 - p) / 200_000)
    assert lean_batches.run_overflow(n, q, steps, n + 1) == 0.0


def test_the_plan_of_the_digits_is_cheaper_and_rarely_repairs():
    lean = lean_batches.plan(1797, 0.01, 20, 60, 256)
    assert lean is not None and 18 < lean.slots < 60 and lean.saving < 0.7
    assert lean.overflow == lean_batches.run_overflow(1797, 0.01, 20, lean.slots) < 0.05
    assert lean_batches.plan(10, 0.5, 4, 10, 8) is None  # every slot needed: full capacity


def _forced(problem, prep, slots: int, repair: int):
    """The engine's lean run with c and K forced (frequent overflow)."""
    run = engine.make_run(problem, prep)
    forced = lean_batches.LeanPlan(slots, repair, 1.0, 1.0)

    def lean_for(c):
        return engine.make_run(problem, prep, batch_slots=c)

    lean = lean_batches.LeanRun(run, lean_for, lambda block: forced)
    lean.repair = repair
    return run, lean


@pytest.mark.parametrize(
    "options",
    [
        {},
        pytest.param({"threat": "white-box", "bug": "no-clip"}, marks=pytest.mark.slow),
    ],
    ids=["gradient canary (ghost clipping)", "white-box, per-example gradients"],
)
def test_repaired_lean_runs_equal_the_full_capacity_where_overflow_is_frequent(options):
    problem = ta.build_problem(data="synthetic", n=63, rate=0.125, steps=4, **options)
    prep = ta.prepare(problem)
    full, lean = _forced(problem, prep, slots=9, repair=3)  # c = 9 for qn = 8: most runs overflow
    key, runs = jax.random.key(5), 32
    want = sharded_runs(full, key, runs, np.float32(1.0), chunk=16)
    got = sharded_runs(lean, key, runs, np.float32(1.0), chunk=16)  # 3 per call: several calls
    # the same batches and steps; only a sum over fewer zero-padded slots may reassociate (float32
    # rounding of O(1) scores: 1e-6 absolute)
    np.testing.assert_allclose(got.score, want.score, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.z, want.z, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got.overflow, want.overflow)
    # negative control: the lean runs unrepaired overflowed often and scored otherwise
    keys = jax.random.split(key, runs)
    raw = jax.vmap(lambda k: lean._lean_for(9)(k, np.float32(1.0)))(keys)
    bad = np.asarray(raw.overflow) > 0
    assert bad.sum() > 10  # P(a run fills 9 slots at one of 4 steps) = 0.88: 28 of 32 expected
    assert np.max(np.abs(np.asarray(raw.score)[bad] - want.score[bad])) > 1e-3


def test_training_runs_are_lean_by_default_and_the_switch_turns_it_off(monkeypatch):
    problem = ta.build_problem(data="synthetic", n=63, rate=0.125, steps=2)
    prep = ta.prepare(problem)
    assert isinstance(engine._engine(problem, prep, None, None, True), lean_batches.LeanRun)
    assert not isinstance(engine._engine(problem, prep, None, None, False), lean_batches.LeanRun)
    shuffled = ta.build_problem(data="synthetic", n=63, sampler="shuffle", batch_size=8, steps=2)
    run = engine._engine(shuffled, ta.prepare(shuffled), None, None, True)
    assert not isinstance(run, lean_batches.LeanRun)
    monkeypatch.setenv(lean_batches.ENV, "0")
    assert not lean_batches.enabled()
    monkeypatch.setenv(lean_batches.ENV, "1")
    assert lean_batches.enabled()


@pytest.mark.slow
def test_training_runs_give_the_same_scores_lean_or_not(monkeypatch):
    problem = ta.build_problem(data="synthetic", n=63, rate=0.125, steps=16, noise=0.5, chunk=64)
    prep = ta.prepare(problem)
    lean = ta.training_runs(jax.random.key(2), problem, 200, prep=prep)
    monkeypatch.setenv(lean_batches.ENV, "0")
    full = ta.training_runs(jax.random.key(2), problem, 200, prep=prep)
    np.testing.assert_allclose(lean.score, full.score, rtol=1e-6, atol=1e-6)  # reassociation only
    np.testing.assert_array_equal(lean.overflow, full.overflow)
