"""The probes of a DP step's noise (``_src/training_auditor/noise_probes.py``) and raw keys re-seeded per run.

Each planted noise bug is named by its own probe and the correct steps are not (negative controls):
the library's dp_sgd, and DP aggregation followed by momentum, Adam, a schedule or weight decay,
which are post-processing. The probes' tests run at a family-wise level of 1e-6 with exact or
Hoeffding-Azuma p-value bounds, so a correct step is named with probability at most 1e-6 by
construction; these tests use one fixed key each (deterministic). The false-alarm rate over 200
correct steps is measured by benchmarks/noise_probes_false_alarms.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbdp_jax import training_audit as ta
from cbdp_jax._src.training_auditor.ops import raw_key_leaves, rekey
from cbdp_jax._src.training_auditor.planted_bugs import DEFECTS_AT_DEFAULTS
from cbdp_jax._src.training_auditor.probes import _times

SYN = dict(data="synthetic", n=31, rate=0.125, steps=6)


def _kinds(problem) -> list[str]:
    return [d.kind for d in ta.prepare(problem).defects]


def _with_step(step, **kw):
    return dataclasses.replace(ta.build_problem(**(SYN | kw)), step=step)


def _dp(*after, clip=1.0, noise=1.0, seed=0):
    aggregate = optax.contrib.differentially_private_aggregate(
        l2_norm_clip=clip, noise_multiplier=noise, seed=seed
    )
    return optax.chain(aggregate, *after)


def _users_step(lr=0.1, clip=1.0, noise=1.0, *, reuse=False, raw=False):
    """A user's DP-SGD step: clip, sum, add N(0, (S C)^2), divide by 4; optionally a buggy key."""

    def init(params):
        del params
        return (jax.random.PRNGKey(0) if raw else jax.random.key(0),)

    def update(grads, state, params=None):
        del params
        norms = jax.vmap(optax.tree.norm)(grads)
        scale = jnp.minimum(1.0, clip / jnp.where(norms > 0, norms, 1.0))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, 1), grads)
        key = jax.random.wrap_key_data(state[0]) if raw else state[0]
        leaves, treedef = jax.tree.flatten(summed)
        nxt, *keys = jax.random.split(key, len(leaves) + 1)
        out = [-lr * (s + noise * clip * jax.random.normal(k, s.shape)) / 4.0
               for s, k in zip(leaves, keys, strict=True)]  # fmt: skip
        kept = state[0] if reuse else (jax.random.key_data(nxt) if raw else nxt)
        return jax.tree.unflatten(treedef, out), (kept,)

    return optax.GradientTransformation(init, update)


# --- the planted bugs ------------------------------------------------------------------------------


def test_key_reuse_is_named_as_noise_that_is_not_fresh_and_the_correct_step_is_not():
    assert _kinds(ta.build_problem(**SYN)) == []  # negative control: the correct dp_sgd
    defects = ta.prepare(ta.build_problem(**(SYN | {"bug": "key-reuse"}))).defects
    assert [d.kind for d in defects] == ["noise-not-fresh"]
    assert "identical to the noise at step" in defects[0].message
    assert "(correlation 1.000" in defects[0].message and defects[0].p_value <= defects[0].level


@pytest.mark.slow  # two probe programs (a minute at load 30)
@pytest.mark.parametrize("bug", ["scalar-noise", "noise-every-other-step"])
def test_scalar_noise_and_skipped_steps_are_named_by_their_probes(bug):
    assert _kinds(ta.build_problem(**(SYN | {"bug": bug}))) == list(DEFECTS_AT_DEFAULTS[bug])


@pytest.mark.slow  # ten probe programs, one per bug
@pytest.mark.parametrize("bug", ta.BUGS)
def test_every_bug_gets_the_defects_of_the_help_table(bug):
    # planted_bugs.DEFECTS_AT_DEFAULTS (in `cbdp audit-training --help`) against the probes at the
    # command line's defaults (only T is smaller: T does not change which probe fails)
    assert _kinds(ta.build_problem(bug=bug, steps=8)) == list(DEFECTS_AT_DEFAULTS[bug])


# --- post-processing is never named -----------------------------------------------------------------

POST = {
    "momentum": lambda: _dp(optax.sgd(0.1, momentum=0.9)),
    "adam": lambda: _dp(optax.adam(0.01)),
    "schedule": lambda: _dp(optax.sgd(optax.exponential_decay(0.5, 1, 0.5))),
    "adamw": lambda: _dp(optax.adamw(0.01, weight_decay=0.1)),
    "dpsgd": lambda: optax.contrib.dpsgd(0.1, 1.0, 1.0, seed=0, momentum=0.5),
}


@pytest.mark.slow  # five probe programs
@pytest.mark.parametrize("name", list(POST))
def test_post_processing_gets_no_defect_and_no_false_blind_spot(name):
    problem = _with_step(POST[name]())
    prep = ta.prepare(problem)
    assert prep.defects == () and prep.blind_spots == (), (prep.defects, prep.blind_spots)


def test_dp_adam_gets_no_batch_normalisation_note():
    # the false note: "-3.73e-08x with 7 others"; the others now lie along another
    # coordinate, so Adam's coordinate-wise normalisation responds to the canary as it does alone
    problem = _with_step(_dp(optax.adam(0.01)))
    assert ta.prepare(problem, noise_probes=False).blind_spots == ()


@pytest.mark.slow  # two probe programs
def test_a_users_optax_step_that_reuses_its_key_is_named():
    assert _kinds(_with_step(_users_step())) == []  # the same step, its key split: clean
    assert _kinds(_with_step(_users_step(reuse=True))) == ["noise-not-fresh"]


# --- raw keys ---------------------------------------------------------------------------------------


def test_a_raw_key_is_reseeded_per_run_and_its_reuse_is_named():
    step = _users_step(raw=True)
    params = {"w": jnp.zeros(3)}
    assert raw_key_leaves(step, params, 4) == (True,)
    state = step.init(params)
    a, b = (rekey(state, jax.random.key(s), (True,))[0] for s in (1, 2))
    assert a.dtype == jnp.uint32 and a.shape == (2,) and not np.array_equal(a, b)
    assert _kinds(_with_step(step)) == []  # refused before: "holds raw uint32 keys"
    assert _kinds(_with_step(_users_step(raw=True, reuse=True))) == ["noise-not-fresh"]


def _counting_step(counter):
    """A correct typed-key step whose state also holds a uint32 ``counter`` (read or not)."""

    def init(params):
        del params
        return (jax.random.key(0), counter)

    def update(grads, state, params=None):
        del params
        key, count = state
        nxt, k = jax.random.split(key)
        summed = jax.tree.map(lambda g: g.sum(0), grads)
        lr = 0.1 / (1.0 + jnp.sum(count).astype(jnp.float32))  # reads the counter
        out = jax.tree.map(lambda s: -lr * (s + jax.random.normal(k, s.shape)), summed)
        return out, (nxt, count + jnp.uint32(1))

    return optax.GradientTransformation(init, update)


@pytest.mark.parametrize(
    "counter, why",
    [
        (jnp.zeros(2, jnp.uint32), "a [2] counter the step reads and increments"),
        (jnp.zeros((), jnp.uint32), "a uint32 scalar: no key's shape"),
        (jnp.zeros(3, jnp.uint32), "trailing dimension 3: no threefry key"),
    ],
)
def test_uint32_counters_are_not_taken_for_raw_keys(counter, why):
    step = _counting_step(counter)
    assert raw_key_leaves(step, {"w": jnp.zeros(3)}, 4) == (False, False), why


def test_an_unread_uint32_pair_is_not_a_key():
    step = optax.GradientTransformation(
        lambda p: (jax.random.key(0), jnp.zeros(2, jnp.uint32)),
        lambda g, s, p=None: (jax.tree.map(lambda x: x.sum(0), g), s),
    )
    assert raw_key_leaves(step, {"w": jnp.zeros(3)}, 4) == (False, False)


# --- notes that cannot contradict the verdict (issue 49, item 4) -----------------------------------


def _clip_after_averaging(lr=0.1, clip=1.0, noise=1.0):
    """A user's step that averages the batch, then clips the average: a global operation."""

    def update(grads, state, params=None):
        del params
        mean = jax.tree.map(lambda g: g.mean(0), grads)
        scale = jnp.minimum(1.0, clip / jnp.maximum(optax.tree.norm(mean), 1e-12))
        leaves, treedef = jax.tree.flatten(mean)
        nxt, *keys = jax.random.split(state[0], len(leaves) + 1)
        out = [-lr * (scale * m + noise * clip * jax.random.normal(k, m.shape) / 8.0)
               for m, k in zip(leaves, keys, strict=True)]  # fmt: skip
        return jax.tree.unflatten(treedef, out), (nxt,)

    return optax.GradientTransformation(lambda p: (jax.random.key(0),), update)


def test_the_notes_of_a_step_that_clips_after_averaging_say_what_was_measured():
    prep = ta.prepare(_with_step(_clip_after_averaging()), noise_probes=False)
    for spot in prep.blind_spots:
        assert "not seen" not in spot.message and "-0x" not in spot.message, spot
    assert _times(-0.0) == "less than 0.001x" and _times(0.125) == "0.125x"


# --- the command line ---------------------------------------------------------------------------------


@pytest.mark.slow  # one audit-training process: about a minute cold
def test_a_defect_without_a_violation_exits_3_and_is_printed():
    # scalar noise leaves the canary coordinate's law exact: no violation, but the probes name it
    proc = subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", "audit-training", "--data", "synthetic", "--rate",
         "0.125", "--steps", "3", "--runs", "200", "--bug", "scalar-noise", "--format", "json"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    rec = json.loads(proc.stdout)
    assert not rec["violation"] and [d["kind"] for d in rec["defects"]] == [
        "noise-dependent-coordinates"
    ]
    assert "not a clean bill" in rec["verdict"]


def test_key_reuse_is_named_on_a_one_parameter_model():
    # worst-case data train one weight: every cosine is 1, so closeness also weighs the distance
    def problem(bug):
        return ta.worst_case_problem(steps=4, noise=1.0, batch_size=4, bug=bug)

    assert _kinds(problem("none")) == []
    assert _kinds(problem("key-reuse")) == ["noise-not-fresh"]
